"""DINOv2: Hugging Face ``dinov2`` and ``dinov2_with_registers`` image classifiers ->
``HydraEnsembleDinov2ForImageClassification`` (layer scale per member, SwiGLU MLP, register tokens).

The reader is :mod:`hydra_hf.convert.hf_dinov2`; the shipped model is ``modeling_hydra_dinov2.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import (
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersForImageClassification,
)

from ..convert.hf_dinov2 import READER, build_dinov2
from ..convert.members import to_module_names
from .adapters import layer_list_adapter
from .base import Built, Family, register_family

PREFIXES = {"dinov2": "Dinov2", "dinov2_with_registers": "Dinov2WithRegisters"}


class Dinov2Family(Family):
    name = "dinov2"
    aliases = ("dinov2_with_registers",)  # the Hydra config's base_model_type of the registers variant
    modality = "image"
    model_types = ("dinov2", "dinov2_with_registers")
    hf_class_prefix = "Dinov2"
    accepted_heads = ("Model", "ForImageClassification")
    base_model_type = "dinov2"
    task = "image-classification"
    config_class_name = "HydraEnsembleDinov2Config"
    config_file = "configuration_hydra_dinov2.py"
    modeling_file = "modeling_hydra_dinov2.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleDinov2Model",
        "AutoModelForImageClassification": "HydraEnsembleDinov2ForImageClassification",
    }
    towers = ("vision",)
    mlp_down_proj = {"vision": r"encoder\.layer\.(\d+)\.mlp\.(?:fc2|weights_out)"}
    frozen_prefixes = ("hydra.embeddings.",)  # patch projection, [CLS], mask and register tokens, positions
    reader = READER

    @property
    def supported_architectures(self) -> tuple[str, ...]:
        return tuple(f"{prefix}{head}" for prefix in PREFIXES.values() for head in self.accepted_heads)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model = build_dinov2(folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels,
                             id2label=id2label, seed=seed)
        return Built(model, folders[0])

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        base = {**hydra_config.base_config, "model_type": hydra_config.base_model_type}
        stock = self.stock_model(base, hydra_config.num_labels)
        return to_module_names(stock, self.reader.unfuse(state, hydra_config))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        base = getattr(model, model.base_model_prefix, model)  # dinov2 / dinov2_with_registers, or the bare model
        return layer_list_adapter(model, "hf_dinov2", [layer.attention for layer in base.encoder.layer],
                                  ("q_proj", "k_proj", "v_proj", "o_proj"), model.config.num_attention_heads,
                                  ("pixel_values",), "vision")

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        """``Dinov2ForImageClassification`` (or the registers variant, by ``base_config["model_type"]``)."""
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        if base_config.get("model_type") == "dinov2_with_registers":
            return Dinov2WithRegistersForImageClassification(
                Dinov2WithRegistersConfig.from_dict({**base_config, **extra})
            )
        return Dinov2ForImageClassification(Dinov2Config.from_dict({**base_config, **extra}))


DINOV2 = register_family(Dinov2Family())
