"""What every Hugging Face text-classifier family with a :class:`~hydra_hf.convert.hf_text.TextLayout`
shares: reading, fusing and building, the pruning adapter, stock models.

A family module subclasses :class:`HFTextFamily`, sets its names and classes and returns its layout
from :meth:`HFTextFamily.layout`; overriding :meth:`~HFTextFamily.full_config`,
:meth:`~HFTextFamily.check_config` or :meth:`~hydra_hf.families.base.Family.adapter` covers what
differs (DistilBERT's config names, ALBERT's shared layers).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers

from ..convert.build import SHAPE_KEYS, check_same_architecture, full_config, label_arguments, load_fused
from ..convert.hf_text import text_reader
from ..convert.io import read_config, read_state_dict
from ..errors import HydraInputError
from .adapters import bert_like_adapter
from .base import Built, Family


class HFTextFamily(Family):
    """A Hugging Face text encoder converted into a sequence-classification Hydra Ensemble.

    Attributes (besides :class:`Family`'s):
        hf_config_class: its transformers config class name (``"RobertaConfig"``).
        hf_task_class: its transformers sequence classifier (``"RobertaForSequenceClassification"``).
        input_keys: the batch keys its stock models read (pruning).
    """

    modality = "text"
    task = "text-classification"
    towers = ("text",)
    mlp_down_proj = {"text": r"encoder\.layer\.(\d+)\.output\.dense"}
    hf_config_class: ClassVar[str]
    hf_task_class: ClassVar[str]
    input_keys: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids")

    @abstractmethod
    def layout(self) -> Any:
        """The family's :class:`~hydra_hf.convert.hf_text.TextLayout`."""

    @property
    def reader(self) -> Any:  # type: ignore[override]
        """The layout's reader (:func:`~hydra_hf.convert.hf_text.text_reader`)."""
        return text_reader(self.layout())

    # fine-tuning keeps what members share frozen; a trained classifier is the layout's classifier group
    @property
    def frozen_prefixes(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.layout().shared)

    @property
    def classifier_keys(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.layout().heads["classifier"].values())

    # ----------------------------------------------------------------------------- converting
    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The architecture part of a ``config.json`` with the defaults of its transformers config
        class filled in (labels and bookkeeping dropped)."""
        return full_config(getattr(transformers, self.hf_config_class), dict(raw))

    def check_config(self, config: Mapping[str, Any], source: str) -> None:
        """Refuse a configuration variant the fused model does not implement (default: none)."""
        if config.get("is_decoder"):
            raise HydraInputError(
                f"{source} is a decoder ({self.name} with is_decoder=True); convert encoder checkpoints"
            )
        position = config.get("position_embedding_type", "absolute")
        if position not in (None, "absolute"):
            raise HydraInputError(
                f"{source} has position_embedding_type={position!r}; the {self.name} Hydra model implements "
                "absolute position embeddings only"
            )

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        for f, c in zip(folders, configs):
            self.check_config(c, repr(str(f)))
        check_same_architecture(folders, configs, SHAPE_KEYS)
        base = configs[0]
        masks.check_compatible(base["num_hidden_layers"], base["num_attention_heads"], model=repr(str(folders[0])))
        loaded = [self.read_member(read_state_dict(f), c, repr(str(f))) for f, c in zip(folders, configs)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        state = self.reader.fuse(members, masks.kept_heads, mlp_fusion, shared)
        layout = self.layout()
        # the labels: the checkpoints' classifier (with its label names) or the caller's
        labels = label_arguments(state, layout.num_labels_key, raw[0], num_labels, id2label)
        config = self.config_class()(
            base_model_type=raw[0].get("model_type", self.base_model_type), base_config=base,
            kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion, member_metadata=masks.member_metadata, **labels,
        )
        torch.manual_seed(seed)  # the per-member heads of a bare encoder are initialised from this seed
        model = self.model_class()(config)
        absent = {fused for names_ in layout.heads.values() for fused in names_ if fused not in state}
        return Built(load_fused(model, state, absent, folders[0], seed), folders[0])

    # ------------------------------------------------------------------------- pruning, stock
    def adapter(self, model: Any, *, class_text_inputs: Any = None) -> Any:
        return bert_like_adapter(model, f"hf_{self.name}", self.input_keys)

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        extra = {"num_labels": num_labels} if num_labels is not None else {}
        config = getattr(transformers, self.hf_config_class).from_dict({**base_config, **extra})
        return getattr(transformers, self.hf_task_class)(config)
