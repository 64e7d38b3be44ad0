"""Text families with their own reader, fuse and modeling files (DeBERTa-v2/v3, ModernBERT).

Their layers do not fit the canonical BERT layout alone (position projections per head, a fused
``Wqkv``, a gated MLP, missing biases), so each has a reader module ``convert/hf_<family>.py`` with
three pure functions (checkpoint state dict -> member, members -> fused state dict, fused -> stock state
dicts) and its own config file next to its modeling file. :class:`CustomTextFamily` does the rest
of what :class:`~hydra_hf.families.base.Family` asks: reading folders, building and loading the
fused model, the pruning adapter and stock models.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers

from ..convert.build import SHAPE_KEYS, check_same_architecture, full_config, label_arguments, load_fused
from ..convert.io import read_config, read_state_dict
from .base import Built, Family


class CustomTextFamily(Family):
    """A Hugging Face text classifier family whose reader and config live in their own files.

    Attributes (besides :class:`Family`'s):
        config_file: the shipped file of its Hydra config class (next to ``modeling_file``).
        reader: its reader's three pure functions (``convert/hf_<family>.py``): checkpoint state dict ->
            member, members -> fused state dict, fused -> stock state dicts.
        hf_config_class, hf_task_class: its transformers config and sequence-classifier class names.
        head_keys: fused tensor names of the per-member classification head (newly initialised, seeded,
            when the checkpoint is a bare or pre-trained encoder).
        input_keys: the batch keys its stock models read (pruning).
    """

    modality = "text"
    task = "text-classification"
    towers = ("text",)
    mlp_down_proj = {"text": r"encoder\.layer\.(\d+)\.output\.dense"}
    config_file: ClassVar[str]
    reader: ClassVar[tuple[Callable, Callable, Callable]]
    hf_config_class: ClassVar[str]
    hf_task_class: ClassVar[str]
    head_keys: ClassVar[tuple[str, ...]] = ("classifier.weight", "classifier.bias")
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")

    # ------------------------------------------------------------------ config in its own file
    @property
    def shipped_files(self) -> tuple[str, ...]:
        return (*super().shipped_files, self.config_file)

    @property
    def auto_map(self) -> dict[str, str]:
        out = super().auto_map
        out["AutoConfig"] = f"{self.config_file.removesuffix('.py')}.{self.config_class_name}"
        return out

    def config_class(self) -> type:
        module = importlib.import_module(f"hydra_hf.modeling.{self.config_file.removesuffix('.py')}")
        return getattr(module, self.config_class_name)

    # ----------------------------------------------------------------------------- converting
    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The architecture part of a ``config.json`` with its transformers defaults filled in."""
        return full_config(getattr(transformers, self.hf_config_class), dict(raw))

    def read_member(self, state: dict, config: dict[str, Any], source: str = "checkpoint") -> Any:
        return self.reader[0](state, config, source=source)

    def fuse(self, members: list[Any], kept_heads: list[list[list[int]]], mlp_fusion: str, shared: str) -> dict:
        """Fused state dict of the task model (full parameter names) from canonical members."""
        return self.reader[1](members, kept_heads, mlp_fusion, shared)

    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        return self.reader[2](state, hydra_config)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int, towers: Sequence[str] | None) -> Built:
        masks.check_towers(self.towers, towers, model=f"a {self.name} checkpoint")
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        check_same_architecture(folders, configs, SHAPE_KEYS)
        base = configs[0]
        masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
        loaded = [self.read_member(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, raw)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        state = self.fuse(members, masks.kept_heads, mlp_fusion, shared)
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
