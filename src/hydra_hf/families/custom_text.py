"""Text families with their own reader, fuse and modeling files (DeBERTa-v2/v3, ModernBERT).

Their layers do not fit the canonical BERT layout alone (position projections per head, a fused
``Wqkv``, a gated MLP, missing biases), so each has a custom reader in ``convert/hf_<family>.py`` (a
:class:`~hydra_hf.convert.reader.Reader`: checkpoint state dict -> member, members -> fused state dict,
fused -> stock state dicts). :class:`CustomTextFamily` does the rest
of what :class:`~hydra_hf.families.base.Family` asks: reading folders, building and loading the
fused model, the pruning adapter and stock models.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers

from ..convert.build import SHAPE_KEYS, check_same_architecture, full_config, label_arguments, load_fused
from ..convert.io import read_config, read_state_dict
from .base import Built, Family


class CustomTextFamily(Family):
    """A Hugging Face text classifier family with a custom reader (``reader``, from ``convert/hf_<family>.py``).

    Attributes (besides :class:`Family`'s):
        hf_config_class, hf_task_class: its transformers config and sequence-classifier class names.
        head_keys: fused tensor names of the per-member classification head (newly initialised, seeded,
            when the checkpoint is a bare or pre-trained encoder).
        input_keys: the batch keys its stock models read (pruning).
    """

    modality = "text"
    task = "text-classification"
    towers = ("text",)
    mlp_down_proj = {"text": r"encoder\.layer\.(\d+)\.output\.dense"}
    hf_config_class: ClassVar[str]
    hf_task_class: ClassVar[str]
    head_keys: ClassVar[tuple[str, ...]] = ("classifier.weight", "classifier.bias")
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")

    # ----------------------------------------------------------------------------- converting
    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The architecture part of a ``config.json`` with its transformers defaults filled in."""
        return full_config(getattr(transformers, self.hf_config_class), dict(raw))

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        check_same_architecture(folders, configs, SHAPE_KEYS)
        base = configs[0]
        masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
        loaded = [self.read_member(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, raw)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        state = self.reader.fuse(members, masks.kept_heads, mlp_fusion, shared)
        labels = label_arguments(state, "classifier.weight", raw[0], num_labels, id2label)
        config = self.config_class()(
            base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
            member_metadata=masks.member_metadata, **labels,
        )
        torch.manual_seed(seed)  # the per-member heads of a bare encoder are initialised from this seed
        model = self.model_class()(config)
        return Built(load_fused(model, state, set(self.head_keys), folders[0], seed), folders[0])

    # -------------------------------------------------------------------------------- pruning
    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        config = getattr(transformers, self.hf_config_class).from_dict({**base_config, **extra})
        return getattr(transformers, self.hf_task_class)(config)


def classifier_logits(model: Any, inputs: Mapping[str, Any]) -> Any:
    """``(B, C)`` logits of a transformers sequence classifier."""
    return model(**inputs).logits
