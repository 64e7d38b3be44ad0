"""What member selection needs of a loaded model, whatever its source: :class:`PruningTarget` (the head
adapter, the preprocessing, the classes), :func:`load_pruning_target` for a Hugging Face text or image
classifier folder or a decoder causal LM folder (or a GGUF checkpoint), :func:`load_zero_shot_lm_target` for a
causal LM read as a zero-shot classifier through a prompt, and :func:`causal_lm_batches` (a causal LM's next-token
batches). ``hydra-hf prune`` and every recipe go from a model and its data specs to masks with
:func:`hydra_hf.workflows.prune.build_members`, which takes a :class:`PruningTarget` or a folder.

Causal LMs (``*ForCausalLM``, ``GPT2LMHeadModel``: :func:`hydra_hf.families.is_causal_lm_config`) are pruned on
next-token prediction (:mod:`hydra_hf.pruning.lm`): the labels are the next tokens of the texts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from ..convert.io import from_pretrained, read_config, weight_names
from ..data import pad_with_eos
from ..errors import HydraInputError
from ..families import detect_family, get_adapter, is_causal_lm_config, resolve_checkpoint
from ..families.adapters import ModelAdapter
from ..lazy import lazy_module
from ..prompting import ZeroShotPrompt
from .lm import causal_lm_adapter, lm_batches
from .zero_shot_lm import zero_shot_lm_adapter

logger = logging.getLogger(__name__)

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")


@dataclass
class PruningTarget:
    """What member selection needs from a loaded model, whatever its source."""

    adapter: ModelAdapter
    transform: Callable[[Any], torch.Tensor] | None  # images: PIL -> (3, S, S); None for text models
    tokenizer: Any  # text models only
    num_labels: int
    label2id: dict[str, int] | None
    zero_shot: bool  # CLIP, or a causal LM asked by prompt: labels index the class names
    prompt: ZeroShotPrompt | None = None  # a causal LM as a zero-shot classifier: the prompt its texts are read in

    @property
    def modality(self) -> str:
        """``"image"`` or ``"text"``: what the model reads."""
        return "image" if self.transform is not None else "text"

    @property
    def causal_lm(self) -> bool:
        """Whether the model is a causal LM pruned on next-token prediction (its labels are the next tokens)."""
        return self.adapter.task == "causal_lm"


def load_zero_shot_lm_target(
    folder: str | os.PathLike, prompt: ZeroShotPrompt, *, class_names: Sequence[str] | None = None,
    trust_remote_code: bool = False,
) -> PruningTarget:
    """A causal LM folder (stock or Hydra, or a GGUF checkpoint) as the zero-shot classifier ``prompt`` makes of
    it: its members are pruned on the cross-entropy of the label-word distribution of labelled ID texts read in
    the prompt (:mod:`hydra_hf.pruning.zero_shot_lm`; ``build_members``' ``max_length`` caps each text's tokens).

    Args:
        folder: the causal LM.
        prompt: the prompt and its label words (one list per class, in label order).
        class_names: the classes' names (default: each class's first label word, stripped).
    """
    folder = resolve_checkpoint(Path(folder))
    config = read_config(folder)
    if not is_causal_lm_config(config):
        what = ", ".join(config.get("architectures") or []) or "no architecture"
        raise HydraInputError(f"{str(folder)!r} ({what}) is not a causal LM; zero-shot prompts need a ...ForCausalLM "
                              "folder (or a GGUF checkpoint)")
    names = list(class_names) if class_names is not None else [w[0].strip() for w in prompt.label_words]
    if len(names) != prompt.num_classes:
        raise HydraInputError(f"{len(names)} class names {names} for a prompt of {prompt.num_classes} classes; give "
                              "one name per class of the label words")
    model = from_pretrained(AutoModelForCausalLM, folder, trust_remote_code=trust_remote_code).eval()
    tokenizer = from_pretrained(AutoTokenizer, folder, trust_remote_code=trust_remote_code)
    adapter = zero_shot_lm_adapter(model, prompt.label_token_ids(tokenizer))
    return PruningTarget(adapter, None, tokenizer, len(names), {n: i for i, n in enumerate(names)}, True, prompt)


def label2id_of(config: Any) -> dict[str, int] | None:
    """A config's ``label2id`` when it names the classes; None for the default ``LABEL_i`` names."""
    mapping = dict(getattr(config, "label2id", None) or {})
    default = {f"LABEL_{i}": i for i in range(getattr(config, "num_labels", 0))}
    return None if not mapping or mapping == default else {str(k): int(v) for k, v in mapping.items()}


def check_classifier_head(folder: Path, family: Any, num_labels: int | None) -> bool:
    """Whether the checkpoint in ``folder`` needs a new classification head of ``num_labels`` classes (it
    has no trained one: a masked-LM or bare encoder checkpoint); raises one line naming ``--num-labels``
    when that number is missing, or given for a trained head of another size."""
    if not family.classifier_keys:  # a family without a classifier of its own (zero-shot)
        return False
    config = read_config(folder)
    if any(key in weight_names(folder) for key in family.classifier_keys):
        trained = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
        if num_labels is not None and num_labels != trained:
            raise HydraInputError(
                f"--num-labels {num_labels}, but the trained classification head of {str(folder)!r} has {trained} "
                "classes; drop --num-labels (it is for a checkpoint without a trained head)"
            )
        return False
    if num_labels is None:
        what = ", ".join(config.get("architectures") or []) or "a bare encoder"
        raise HydraInputError(
            f"{str(folder)!r} has no trained classification head ({what} checkpoint: none of "
            f"{list(family.classifier_keys)} in its weights); pass --num-labels N, the classes of --id-data, to prune "
            "it with a new head, or prune a fine-tuned classifier"
        )
    logger.info("%s has no trained classification head: pruning with a new one of %d classes (--num-labels)",
                folder, num_labels)
    return True


@contextlib.contextmanager
def _without_load_report() -> Iterator[None]:
    """Load a checkpoint into a classifier without transformers' LOAD REPORT (a warning of
    ``transformers.modeling_utils`` listing every tensor of the new head as missing and of the old one
    as unexpected): :func:`check_classifier_head` has said it in one line. A filter, not a level: that
    logger's level at WARNING or above makes transformers log a tensor-parallel warning instead."""
    report = logging.getLogger("transformers.modeling_utils")
    drop = _DropLoadReport()
    report.addFilter(drop)
    try:
        yield
    finally:
        report.removeFilter(drop)


class _DropLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def load_pruning_target(
    folder: str | os.PathLike, *, num_labels: int | None = None, trust_remote_code: bool = False
) -> PruningTarget:
    """A Hugging Face text or image classifier folder (with its tokenizer / image processor), in eval
    mode. The family is detected from ``config.json``; CLIP-like (zero-shot) folders need class
    prompts and are loaded by their caller (``hydra-hf prune --class-names``).

    Args:
        folder: the checkpoint folder, or a GGUF checkpoint (a ``.gguf`` file or a folder holding one: its
            cached plain folder, :func:`hydra_hf.families.resolve_checkpoint`; a causal LM).
        num_labels: classes of a checkpoint without a trained classifier head.
        trust_remote_code: allow a folder that ships its own Python code.
    """
    folder = resolve_checkpoint(folder)
    family = detect_family(folder)  # refuses unknown layouts and task heads the family does not build
    if family.task == "zero-shot-image-classification":
        raise ValueError(f"{str(folder)!r} is a zero-shot {family.name} model: give its class prompts "
                         "(hydra-hf prune --class-names)")
    if is_causal_lm_config(read_config(folder)):
        return load_causal_lm_target(folder, num_labels=num_labels, trust_remote_code=trust_remote_code)
    new_head = check_classifier_head(folder, family, num_labels)
    kwargs: dict[str, Any] = {"num_labels": num_labels} if num_labels is not None else {}
    kwargs["trust_remote_code"] = trust_remote_code
    loader = AutoModelForImageClassification if family.modality == "image" else AutoModelForSequenceClassification
    with _without_load_report() if new_head else contextlib.nullcontext():
        model = from_pretrained(loader, folder, **kwargs).eval()
    if family.modality == "image":
        processor = from_pretrained(AutoImageProcessor, folder, trust_remote_code=trust_remote_code)
        transform = lambda image: processor(image, return_tensors="pt")["pixel_values"][0]  # noqa: E731  (3, H, W)
        return PruningTarget(
            get_adapter(model), transform, None, model.config.num_labels, label2id_of(model.config), False
        )
    tokenizer = pad_with_eos(from_pretrained(AutoTokenizer, folder, trust_remote_code=trust_remote_code), model.config)
    return PruningTarget(
        get_adapter(model), None, tokenizer, model.config.num_labels, label2id_of(model.config), False
    )


def load_causal_lm_target(
    folder: str | os.PathLike, *, num_labels: int | None = None, trust_remote_code: bool = False
) -> PruningTarget:
    """A decoder causal LM folder (``*ForCausalLM``, ``GPT2LMHeadModel``) with its tokenizer, in eval
    mode, pruned on next-token prediction (:func:`~hydra_hf.pruning.lm.causal_lm_adapter`).

    ``num_labels`` must be None: a causal LM's classes are its vocabulary (``PruningTarget.num_labels``
    is the number of its token embeddings). A GGUF checkpoint is read through its cached plain folder
    (:func:`hydra_hf.families.resolve_checkpoint`)."""
    folder = resolve_checkpoint(folder)
    config = read_config(folder)
    what = ", ".join(config.get("architectures") or []) or "causal LM"
    if num_labels is not None:
        raise HydraInputError(
            f"--num-labels {num_labels} is for classifiers, but {str(folder)!r} is a causal LM ({what}) pruned on "
            "next-token prediction; drop --num-labels (or prune a ...ForSequenceClassification checkpoint)"
        )
    model = from_pretrained(AutoModelForCausalLM, folder, trust_remote_code=trust_remote_code).eval()
    try:
        tokenizer = from_pretrained(AutoTokenizer, folder, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise HydraInputError(
            f"{str(folder)!r} ({what}) has no tokenizer to turn the ID texts into tokens; save it next to the model "
            f"(tokenizer.save_pretrained({str(folder)!r})): {' '.join(str(exc).split()) or type(exc).__name__}"
        ) from None
    vocab = int(model.get_input_embeddings().num_embeddings)  # the token ids the model can read
    return PruningTarget(causal_lm_adapter(model), None, tokenizer, vocab, None, False)


def causal_lm_batches(
    target: PruningTarget, dataset: datasets.Dataset, *, max_length: int, batch_size: int, what: str = "the data"
) -> list[dict[str, torch.Tensor]]:
    """Next-token batches (:func:`~hydra_hf.pruning.lm.lm_batches`) of the ``text`` column of ``dataset``,
    tokenized by the causal LM target's tokenizer; raises one line when no text has 2 tokens."""
    batches = lm_batches(target.tokenizer, list(dataset["text"]), max_length=max_length, batch_size=batch_size)
    if not batches:
        raise HydraInputError(
            f"{what}: none of its {len(dataset)} texts has 2 or more tokens (a token and its successor); "
            "give longer texts (or a larger --max-length)"
        )
    vocab = target.num_labels  # a causal LM target's vocabulary size
    top = max(int(b["input_ids"].max()) for b in batches)
    if top >= vocab:
        raise HydraInputError(
            f"{what}: the tokenizer gives token id {top} but the model's vocabulary has {vocab} tokens; save the "
            "tokenizer the model was trained with next to it (or resize its embeddings)"
        )
    return batches
