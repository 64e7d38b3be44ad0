"""SigLIP: Hugging Face ``siglip`` models -> ``HydraEnsembleSiglipModel`` (zero-shot image classification;
both towers pruned, member m = the pair (vision tower m, text tower m), the vision tower's
attention-pooling head kept per member, not pruned).

Zero-shot scores are sigmoids, one per (image, text): the ensemble's ``logits_per_image`` is the logit of
the members' mean probability, so the stock ``zero-shot-image-classification`` pipeline returns the
mean. Its folders ship no Hydra uncertainty pipeline (those assume a softmax over the labels). The
reader is :mod:`hydra_hf.convert.hf_siglip`; the shipped model is ``modeling_hydra_siglip.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import SiglipConfig, SiglipModel

from ..convert.hf_siglip import READER, build_siglip
from ..convert.members import to_module_names
from .adapters import hf_clip_adapter
from .base import Built, Family, register_family


class SiglipFamily(Family):
    name = "siglip"
    modality = "image-text"
    model_types = ("siglip",)
    hf_class_prefix = "Siglip"
    accepted_heads = ("Model",)
    base_model_type = "siglip"
    task = "zero-shot-image-classification"
    config_class_name = "HydraEnsembleSiglipConfig"
    config_file = "configuration_hydra_siglip.py"
    modeling_file = "modeling_hydra_siglip.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleSiglipModel",
        "AutoModelForZeroShotImageClassification": "HydraEnsembleSiglipModel",
    }
    towers = ("vision", "text")
    mlp_down_proj = {
        "vision": r"vision_model\.encoder\.layers\.(\d+)\.mlp\.fc2",
        "text": r"text_model\.encoder\.layers\.(\d+)\.mlp\.fc2",
    }
    frozen_prefixes = ("vision_model.embeddings.", "text_model.embeddings.")  # convert.hf_siglip.SHARED_KEYS
    classifier_keys = ()
    reader = READER
    # SigLIP was trained on prompts padded to 64 tokens (its last token is pooled): as transformers' pipeline
    prompt_tokenizer_kwargs = {"padding": "max_length", "max_length": 64, "truncation": True}
    uncertainty_pipelines = False  # its scores are one sigmoid per (image, label), not a softmax over the labels

    def prompt_tokenizer_kwargs_for(self, config: Any) -> dict[str, Any]:
        """64 tokens, or fewer when the text tower has fewer positions (padded past them, prompts would index
        past its position embeddings)."""
        kwargs = dict(self.prompt_tokenizer_kwargs)
        data = config.to_dict()
        text = (data.get("base_config") or data).get("text_config") or {}
        positions = text.get("max_position_embeddings")
        if isinstance(positions, int) and not isinstance(positions, bool) and 0 < positions < kwargs["max_length"]:
            kwargs["max_length"] = positions
        return kwargs

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        return Built(build_siglip(folders, masks, mlp_fusion=mlp_fusion, shared=shared), folders[0])

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        return to_module_names(self.stock_model(hydra_config.base_config), self.reader.unfuse(state, hydra_config))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        adapter = hf_clip_adapter(model, class_text_inputs)  # the same layout; logits_per_image are SigLIP's
        adapter.kind = "hf_siglip"
        return adapter

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        return SiglipModel(SiglipConfig.from_dict(dict(base_config)))


SIGLIP = register_family(SiglipFamily())
