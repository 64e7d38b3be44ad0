"""CLIP: Hugging Face ``clip`` models -> ``HydraEnsembleCLIPModel`` (zero-shot image classification;
both towers pruned, member m = the pair (vision tower m, text tower m)).

The reader is :mod:`hydra_hf.convert.hf_clip`; the shipped model is ``modeling_hydra_clip.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import CLIPConfig, CLIPModel

from ..convert.hf_clip import READER, build_clip
from .adapters import hf_clip_adapter
from .base import Built, Family, register_family


class CLIPFamily(Family):
    name = "clip"
    modality = "image-text"
    model_types = ("clip",)
    hf_class_prefix = "CLIP"
    accepted_heads = ("Model",)
    base_model_type = "clip"
    task = "zero-shot-image-classification"
    config_class_name = "HydraEnsembleCLIPConfig"
    config_file = "configuration_hydra_clip.py"
    modeling_file = "modeling_hydra_clip.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleCLIPModel",
        # what pipeline("zero-shot-image-classification") loads
        "AutoModelForZeroShotImageClassification": "HydraEnsembleCLIPModel",
    }
    towers = ("vision", "text")
    mlp_down_proj = {
        "vision": r"vision_model\.encoder\.layers\.(\d+)\.mlp\.fc2",
        "text": r"text_model\.encoder\.layers\.(\d+)\.mlp\.fc2",
    }
    # convert.hf_clip.SHARED_KEYS: both towers' embeddings, the vision pre-LayerNorm, the logit scale
    frozen_prefixes = (
        "vision_model.embeddings.",
        "vision_model.pre_layrnorm.",
        "text_model.embeddings.",
        "logit_scale",
    )
    classifier_keys = ()
    reader = READER

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        return Built(build_clip(folders, masks, mlp_fusion=mlp_fusion, shared=shared), folders[0])

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return hf_clip_adapter(model, class_text_inputs)

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        return CLIPModel(CLIPConfig.from_dict(dict(base_config)))


CLIP = register_family(CLIPFamily())
