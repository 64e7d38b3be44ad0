"""open_clip: folders with ``open_clip_config.json`` + weights, converted to the equivalent HF CLIP:
the Hydra model is the CLIP family's (``base_model_type="clip"``).

The reader is :mod:`hydra_hf.convert.open_clip`; a ``CLIPProcessor`` with open_clip's tokenizer and
preprocessing is written next to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..convert.open_clip import READER, build_open_clip, is_open_clip_folder
from .adapters import open_clip_adapter
from .base import Built, register_family
from .clip import CLIPFamily


class OpenCLIPFamily(CLIPFamily):
    name = "open_clip"
    mlp_down_proj = {
        "vision": r"visual\.transformer\.resblocks\.(\d+)\.mlp\.c_proj",
        "text": r"^transformer\.resblocks\.(\d+)\.mlp\.c_proj",
    }
    aliases = ("openclip",)
    model_types = ()
    hf_class_prefix = None
    reader = READER  # read_member's config: the model_cfg of open_clip_config.json

    def detect(self, folder: Path, config: Mapping[str, Any] | None) -> bool:
        return config is None and is_open_clip_folder(folder)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        model, extra = build_open_clip(folders, masks, mlp_fusion=mlp_fusion, shared=shared)
        return Built(model, None, extra)

    def owns_model(self, model: Any) -> bool:
        if not type(model).__module__.startswith("open_clip"):
            return False
        import open_clip  # heavy: imported only for open_clip models

        return isinstance(model, (open_clip.CLIP, open_clip.CustomTextCLIP))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return open_clip_adapter(model, class_text_inputs)


OPEN_CLIP = register_family(OpenCLIPFamily())
