"""BEiT: Hugging Face ``beit`` image classifiers -> ``HydraEnsembleBeitForImageClassification``.

The relative position bias tables are sliced with the kept heads, layer scale and pooling are kept per
member. The reader is :mod:`hydra_hf.convert.hf_beit`; the shipped model is ``modeling_hydra_beit.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import BeitConfig, BeitForImageClassification

from ..convert.hf_beit import READER, build_beit
from ..convert.members import to_module_names
from .adapters import layer_list_adapter
from .base import Built, Family, register_family


class BeitFamily(Family):
    name = "beit"
    modality = "image"
    model_types = ("beit",)
    hf_class_prefix = "Beit"
    accepted_heads = ("Model", "ForImageClassification")
    base_model_type = "beit"
    task = "image-classification"
    config_class_name = "HydraEnsembleBeitConfig"
    config_file = "configuration_hydra_beit.py"
    modeling_file = "modeling_hydra_beit.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleBeitModel",
        "AutoModelForImageClassification": "HydraEnsembleBeitForImageClassification",
    }
    towers = ("vision",)
    mlp_down_proj = {"vision": r"layers\.(\d+)\.mlp\.fc2"}
    frozen_prefixes = ("hydra.embeddings.",)  # patch projection, [CLS] token, absolute positions if any
    reader = READER

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model = build_beit(folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels,
                           id2label=id2label, seed=seed)
        return Built(model, folders[0])

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        stock = self.stock_model(hydra_config.base_config, hydra_config.num_labels)
        return to_module_names(stock, self.reader.unfuse(state, hydra_config))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        base = getattr(model, "beit", model)
        return layer_list_adapter(model, "hf_beit", [layer.attention for layer in base.layers],
                                  ("q_proj", "k_proj", "v_proj", "o_proj"), model.config.num_attention_heads,
                                  ("pixel_values",), "vision")

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        return BeitForImageClassification(BeitConfig.from_dict({**base_config, **extra}))


BEIT = register_family(BeitFamily())
