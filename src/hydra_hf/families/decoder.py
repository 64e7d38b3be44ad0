"""What every decoder family shares (Llama-style, GPT-2): :class:`DecoderFamily`.

A decoder checkpoint is a causal LM (``*ForCausalLM``, ``GPT2LMHeadModel``: builds the fused causal LM, or the
classifier when classes are asked for) or a sequence classifier / bare decoder (builds the fused classifier; the
per-member ``score`` heads of a bare decoder or a causal LM are new, seeded). The family's custom reader (a
:class:`~hydra_hf.convert.reader.Reader` from ``convert/hf_<family>.py``) reads a checkpoint into a canonical
member (with ``lm_head`` / ``score``), fuses members (``task=``, ``lm_head_fusion=``) and splits a fused state
dict back (``task=``). Folders ship the common files without the encoder skeletons, the family's config and
modeling files and ``hydra_decoder.py`` (the decoders' outputs and generation uncertainty).
"""

from __future__ import annotations

import logging
import os
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from transformers import GenerationConfig

from ..convert.build import check_same_architecture, label_arguments, load_fused
from ..convert.gguf import is_gguf
from ..convert.io import read_config, read_state_dict
from ..errors import HydraInputError
from .base import Built, Family

logger = logging.getLogger(__name__)

# what makes a checkpoint a causal LM (any family, stock or Hydra): its architectures' suffix
CAUSAL_LM_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def is_causal_lm_config(config: Any) -> bool:
    """Whether a ``config.json`` (a dict or a config object) names a causal LM head (``LlamaForCausalLM``,
    ``GPT2LMHeadModel``, ``HydraEnsembleLlamaForCausalLM``, ...) in its ``architectures``."""
    names = config.get("architectures") if isinstance(config, dict) else getattr(config, "architectures", None)
    return any(str(name).endswith(CAUSAL_LM_SUFFIXES) for name in names or [])


def is_causal_lm_folder(folder: str | os.PathLike) -> bool:
    """Whether the checkpoint folder ``folder`` holds a causal LM (:func:`is_causal_lm_config`); False
    without a ``config.json``. A GGUF checkpoint is one (transformers reads it as a ``*ForCausalLM``)."""
    path = Path(folder)
    if is_gguf(path):
        return True
    return (path / "config.json").is_file() and is_causal_lm_config(read_config(path))


CAUSAL_LM, SEQUENCE_CLASSIFICATION = "causal_lm", "sequence_classification"
DECODER_SHARED_FILE = "hydra_decoder.py"


def decoder_task(config: Mapping[str, Any], causal_lm_architectures: Sequence[str]) -> str:
    """``"causal_lm"`` when ``config["architectures"]`` names one of ``causal_lm_architectures``, else
    ``"sequence_classification"``."""
    names = config.get("architectures") or []
    return CAUSAL_LM if any(a in causal_lm_architectures for a in names) else SEQUENCE_CLASSIFICATION


class DecoderFamily(Family):
    """A decoder family. Subclasses set the :class:`Family` attributes (``reader``, ``config_file`` ...),
    ``causal_lm_architectures`` and ``shape_keys``, and implement :meth:`full_config`, :meth:`layer_shape`
    (``(L, H)`` from a full base config), :meth:`adapter` and :meth:`stock_model`."""

    modality = "text"
    task = "text-classification"
    towers = ("text",)
    mlp_down_proj = {"text": r"layers\.(\d+)\.mlp\.down_proj"}
    classifier_keys = ("score.weight",)
    causal_lm_architectures: ClassVar[tuple[str, ...]]
    shape_keys: ClassVar[tuple[str, ...]]

    @property
    def shipped_files(self) -> tuple[str, ...]:
        """The common files but the encoder skeletons (a decoder does not use them), the family's config and
        modeling files and the decoders' shared file (outputs, generation uncertainty)."""
        return (*(f for f in super().shipped_files if f != "hydra_skeletons.py"), DECODER_SHARED_FILE)

    @abstractmethod
    def full_config(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The architecture part of a ``config.json`` with its transformers defaults filled in."""

    @abstractmethod
    def layer_shape(self, base: Mapping[str, Any]) -> tuple[int, int]:
        """``(num_layers, num_heads)`` of a full base config."""

    def key_value_heads(self, base: Mapping[str, Any]) -> int:
        """Key/value heads per layer of a full base config (grouped-query attention; default: one per query head)."""
        return self.layer_shape(base)[1]

    def task_of(self, raw: Mapping[str, Any]) -> str:
        return decoder_task(raw, self.causal_lm_architectures)

    # ----------------------------------------------------------------------------- converting
    def unfuse_whole_mlps(self, state: dict, hydra_config: Any) -> list[dict]:
        task = SEQUENCE_CLASSIFICATION if "score.weight" in state else CAUSAL_LM
        return self.reader.unfuse(state, hydra_config, task=task)

    def build(self, folders: list[Path], masks: Any, *, mlp_fusion: str, shared: str, num_labels: int | None,
              id2label: dict[int, str] | None, seed: int) -> Built:
        raw = [read_config(f) for f in folders]
        configs = [self.full_config(c) for c in raw]
        check_same_architecture(folders, configs, self.shape_keys)
        base = configs[0]
        masks.check_compatible(*self.layer_shape(base), model=repr(str(folders[0])))
        masks.check_key_value_heads(self.key_value_heads(base), source="the masks", model=repr(str(folders[0])))
        task = self.task_of(raw[0])
        if any(self.task_of(c) != task for c in raw[1:]):
            raise HydraInputError("the member checkpoints mix causal LMs and sequence classifiers; convert one kind")
        if task == CAUSAL_LM and (num_labels is not None or id2label):
            # classes asked of a causal LM (a GGUF checkpoint, a pretrained LM): the last-token classifier of its
            # decoder, with new per-member score heads; its lm_head is not used
            logger.info("%s is a causal LM: building a sequence classifier of %d classes with new heads from "
                        "its decoder", folders[0], len(id2label) if id2label else num_labels)
            task = SEQUENCE_CLASSIFICATION
        loaded = [self.read_member(read_state_dict(f), c, source=repr(str(f))) for f, c in zip(folders, configs)]
        members = loaded * masks.num_members if len(loaded) == 1 else loaded
        if task == CAUSAL_LM and any(m.lm_head is None for m in members):
            raise HydraInputError(
                f"{str(folders[0])!r} is a causal LM without an lm_head tensor; save it with its head"
            )
        heads = [m.lm_head for m in members if m.lm_head is not None]
        # fine-tuned members whose output embeddings differ keep their own; otherwise one shared head
        lm_head_fusion = "per_member" if any(not torch.equal(heads[0], h) for h in heads[1:]) else "shared"
        state = self.reader.fuse(
            members, masks.kept_heads, mlp_fusion, shared, task=task, lm_head_fusion=lm_head_fusion
        )
        labels = label_arguments(state, "score.weight", raw[0], num_labels, id2label) if task != CAUSAL_LM else {}
        config = self.config_class()(
            base_model_type=base["model_type"], base_config=base, kept_heads=masks.kept_heads, mlp_fusion=mlp_fusion,
            member_metadata=masks.member_metadata, lm_head_fusion=lm_head_fusion, **labels,
        )
        auto = "AutoModelForCausalLM" if task == CAUSAL_LM else "AutoModelForSequenceClassification"
        torch.manual_seed(seed)  # a bare decoder's per-member score heads are initialised from this seed
        model = self.model_class(auto)(config)
        # a tied base: lm_head.weight is the token embeddings' tensor (the same values are loaded into it twice)
        model = load_fused(model, state, {"score.weight"}, folders[0], seed)
        if task == CAUSAL_LM and (folders[0] / "generation_config.json").is_file():
            # the base's decoding settings (its end-of-sequence tokens, e.g. a chat model's list, its sampling
            # defaults) as transformers reads them with the base; else the tokens of the base's config
            model.generation_config = GenerationConfig.from_pretrained(folders[0])
        return Built(model, folders[0])

    @abstractmethod
    def stock_class(self, base_config: Mapping[str, Any], num_labels: int | None) -> type:
        """The transformers class of one member: the classifier with ``num_labels``, else the causal LM."""

    def stock_model(self, base_config: Mapping[str, Any], num_labels: int | None = None) -> Any:
        config_class = self.stock_class(base_config, num_labels).config_class
        config = config_class.from_dict({**base_config, **({"num_labels": num_labels} if num_labels else {})})
        return self.stock_class(base_config, num_labels)(config)
