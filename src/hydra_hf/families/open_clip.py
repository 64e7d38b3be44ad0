"""open_clip: folders with ``open_clip_config.json`` + weights, converted to the equivalent HF CLIP:
the Hydra model is the CLIP family's (``base_model_type="clip"``).

The reader is :mod:`hydra_hf.convert.open_clip`; a ``CLIPProcessor`` with open_clip's tokenizer and
preprocessing is written next to the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Built, register_family
from .clip import CLIPFamily


class OpenCLIPFamily(CLIPFamily):
    name = "open_clip"
    aliases = ("openclip",)
    model_types = ()
    hf_class_prefix = None

    def detect(self, folder: Path, config: Mapping[str, Any] | None) -> bool:
        from ..convert.open_clip import is_open_clip_folder

        return config is None and is_open_clip_folder(folder)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int, towers: Sequence[str] | None) -> Built:
        from ..convert.api import _build_clip

        model, extra = _build_clip("open-clip", folders, masks, mlp_fusion, shared, towers)
        return Built(model, None, extra)

    def read_member(self, state: dict, config: dict[str, Any], source: str = "checkpoint") -> Any:
        """``config``: the ``model_cfg`` of ``open_clip_config.json``."""
        from ..convert.open_clip import open_clip_member_from_state_dict

        return open_clip_member_from_state_dict(state, config, source=source)

    def owns_model(self, model: Any) -> bool:
        if not type(model).__module__.startswith("open_clip"):
            return False
        import open_clip

        return isinstance(model, (open_clip.CLIP, open_clip.CustomTextCLIP))

    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        from ..pruning.adapters import _open_clip_adapter

        return _open_clip_adapter(model, class_text_inputs)


OPEN_CLIP = register_family(OpenCLIPFamily())
