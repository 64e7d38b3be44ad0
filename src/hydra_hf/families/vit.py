"""ViT: Hugging Face ``vit`` image classifiers -> ``HydraEnsembleForImageClassification``.

The reader is :mod:`hydra_hf.convert.hf_vit`; the shipped model is ``modeling_hydra_vit.py``
(pre-LN layers, per-member final LayerNorm and classifier on the CLS token).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import ViTConfig, ViTForImageClassification

from ..convert.hf_vit import READER, build_vit
from .adapters import hf_vit_adapter
from .base import Built, Family, register_family


class ViTFamily(Family):
    name = "vit"
    modality = "image"
    model_types = ("vit",)
    hf_class_prefix = "ViT"
    accepted_heads = ("Model", "ForImageClassification")
    base_model_type = "vit"
    task = "image-classification"
    config_class_name = "HydraEnsembleViTConfig"
    config_file = "configuration_hydra_vit.py"
    modeling_file = "modeling_hydra_vit.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleViTModel",
        "AutoModelForImageClassification": "HydraEnsembleForImageClassification",
    }
    towers = ("vision",)
    mlp_down_proj = {"vision": r"layers\.(\d+)\.mlp\.fc2"}
    # patch projection, CLS token, position embeddings
    frozen_prefixes = ("hydra.embeddings.",)
    reader = READER

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model = build_vit(
            folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels, id2label=id2label, seed=seed
        )
        return Built(model, folders[0])

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        return self.reader.unfuse(state, hydra_config, names="module")

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return hf_vit_adapter(model)

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        return ViTForImageClassification(ViTConfig.from_dict({**base_config, **extra}))


VIT = register_family(ViTFamily())
