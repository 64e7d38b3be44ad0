"""How a family reads its checkpoints: one :class:`Reader` per family, made in one of two ways.

- **A layout table**: the family names where its checkpoint keeps each tensor and the shared functions
  read, fuse and unfuse it: :class:`~hydra_hf.convert.hf_text.TextLayout` for the post-LN text encoders
  (BERT, RoBERTa, ELECTRA, DistilBERT, ALBERT), :class:`~hydra_hf.convert.members.Layout` for DeiT, BEiT,
  DINOv2 and SigLIP.
- **A custom reader**: three pure functions in the family's own module (``hf_<family>.py``) for checkpoints
  a table does not describe (DeBERTa's position projections, ModernBERT's fused ``Wqkv``, the decoders'
  grouped-query attention and ``lm_head``, ViT, CLIP, timm and open_clip).

Either way the family holds a :class:`Reader`, so the step from masks to fused tensors reads by name:
``reader.read_member(...)``, ``reader.fuse(...)``, ``reader.unfuse(...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Reader(NamedTuple):
    """The three pure state-dict functions of a family's checkpoints.

    Attributes:
        read_member: ``(state, config, source=...) -> member``: one checkpoint's state dict in canonical form
            (key counts and shapes checked).
        fuse: ``(members, kept_heads, mlp_fusion, shared, ...) -> state``: the fused model's state dict from
            M canonical members and the heads each keeps.
        unfuse: ``(state, hydra_config, ...) -> [state]``: one stock state dict per member from a fused one
            (removed heads zeroed), the inverse of ``fuse``.
    """

    read_member: Callable[..., Any]
    fuse: Callable[..., dict[str, Any]]
    unfuse: Callable[..., list[dict[str, Any]]]
