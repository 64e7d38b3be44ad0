"""DeiT: Hugging Face ``deit`` image classifiers -> ``HydraEnsembleDeiTForImageClassification``.

Both heads of the distilled model (``DeiTForImageClassificationWithTeacher``) are kept per member. The
reader is :mod:`hydra_hf.convert.hf_deit`; the shipped model is ``modeling_hydra_deit.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import DeiTConfig, DeiTForImageClassification, DeiTForImageClassificationWithTeacher

from ..convert.hf_deit import READER, build_deit
from ..convert.members import to_module_names
from .adapters import layer_list_adapter
from .base import Built, Family, register_family


class DeiTFamily(Family):
    name = "deit"
    modality = "image"
    model_types = ("deit",)
    hf_class_prefix = "DeiT"
    accepted_heads = ("Model", "ForImageClassification", "ForImageClassificationWithTeacher")
    base_model_type = "deit"
    task = "image-classification"
    config_class_name = "HydraEnsembleDeiTConfig"
    config_file = "configuration_hydra_deit.py"
    modeling_file = "modeling_hydra_deit.py"
    model_class_names = {
        "AutoModel": "HydraEnsembleDeiTModel",
        "AutoModelForImageClassification": "HydraEnsembleDeiTForImageClassification",
    }
    towers = ("vision",)
    mlp_down_proj = {"vision": r"layers\.(\d+)\.mlp\.fc2"}
    frozen_prefixes = ("hydra.embeddings.",)  # patch projection, [CLS] and distillation tokens, positions
    classifier_keys = ("classifier.weight", "cls_classifier.weight")
    reader = READER

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model = build_deit(folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels,
                           id2label=id2label, seed=seed)
        return Built(model, folders[0])

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        stock = self.stock_model(hydra_config.base_config, hydra_config.num_labels, distilled=hydra_config.distilled)
        return to_module_names(stock, self.reader.unfuse(state, hydra_config))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        base = getattr(model, "deit", model)
        return layer_list_adapter(model, "hf_deit", [layer.attention for layer in base.layers],
                                  ("q_proj", "k_proj", "v_proj", "o_proj"), model.config.num_attention_heads,
                                  ("pixel_values",), "vision")

    def stock_model(
        self, base_config: Mapping[str, Any], num_labels: int | None = None, distilled: bool = False
    ) -> Any:
        """``DeiTForImageClassification``, or ``DeiTForImageClassificationWithTeacher`` when ``distilled``."""
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        cls = DeiTForImageClassificationWithTeacher if distilled else DeiTForImageClassification
        return cls(DeiTConfig.from_dict({**base_config, **extra}))


DEIT = register_family(DeiTFamily())
