"""timm ViTs: timm ``vit_*`` folders (``config.json`` with ``architecture`` + weights), converted to the
equivalent HF ViT: the Hydra model is the ViT family's (``base_model_type="vit"``).

The reader is :mod:`hydra_hf.convert.timm_vit`; a ``ViTImageProcessor`` with timm's preprocessing is
written next to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..convert.timm_vit import READER, build_timm_vit, is_timm_vit_config
from .adapters import timm_vit_adapter
from .base import Built, register_family
from .vit import ViTFamily


class TimmViTFamily(ViTFamily):
    name = "timm_vit"
    mlp_down_proj = {"vision": r"blocks\.(\d+)\.mlp\.fc2"}
    aliases = ("timm",)
    model_types = ()
    hf_class_prefix = None  # timm configs name an `architecture`, not transformers classes
    classifier_keys = ("head.weight",)
    reader = READER  # timm's names read into ViT's member; fused and split back as a ViT

    def detect(self, folder: Path, config: Mapping[str, Any] | None) -> bool:
        return config is not None and is_timm_vit_config(dict(config))

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model, extra = build_timm_vit(folders, masks, mlp_fusion=mlp_fusion, shared=shared, num_labels=num_labels,
                                      id2label=id2label, seed=seed)
        return Built(model, None, extra)

    def owns_model(self, model: Any) -> bool:
        if not type(model).__module__.startswith("timm."):
            return False
        from timm.models.vision_transformer import VisionTransformer  # heavy: imported only for timm models

        return isinstance(model, VisionTransformer)

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return timm_vit_adapter(model)


TIMM_VIT = register_family(TimmViTFamily())
