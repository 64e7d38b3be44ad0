"""Head pruning of a causal LM used as a zero-shot classifier (:class:`hydra_hf.prompting.ZeroShotPrompt`).

The model reads each labelled text inside the prompt; its logits for the classes are the label words' next-token
log-probabilities after the prompt (:func:`hydra_hf.prompting.label_word_logits`), so the classification loss
that Taylor importance and circuit search score is the cross-entropy of the label-word distribution renormalised
over the classes -- the zero-shot task's own loss, with no training:

- :func:`zero_shot_lm_batches`: left-padded prompts of a labelled dataset (``input_ids``, ``attention_mask``,
  ``position_ids`` numbering every row's real tokens from 0, ``labels``);
- :func:`zero_shot_lm_adapter`: the decoder's head layout with those class logits, ``(B, C)``, ``task=
  "classification"``: :func:`~hydra_hf.pruning.taylor.taylor_prune` and the circuit searches run unchanged.

:func:`hydra_hf.pruning.load_zero_shot_lm_target` loads a folder as such a target; ``build_members`` then makes
these batches from its ID data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..families.adapters import ModelAdapter, decoder_adapter
from ..lazy import lazy_module
from ..prompting import ZeroShotPrompt, label_word_logits, left_padded, text_ids

# heavy (datasets, pandas, pyarrow: ~2 s): imported on first use, so that `import hydra_hf` stays light (lazy.py)
datasets = lazy_module("datasets")

INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")


def pad_id(tokenizer: Any) -> int:
    """The id prompts are padded with: the tokenizer's pad token, else its EOS token, else 0 (padding is masked)."""
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, key, None)
        if isinstance(value, int):
            return value
    return 0


def zero_shot_lm_batches(tokenizer: Any, prompt: ZeroShotPrompt, dataset: datasets.Dataset, *, batch_size: int,
                         max_text_tokens: int) -> list[dict[str, torch.Tensor]]:
    """The prompts of ``dataset``'s texts (its ``label`` column as ``labels`` when it has one), ``batch_size`` per
    batch in the dataset's order, left padded: the next-token logits of every row sit at its last position.

    Shape: ``input_ids``, ``attention_mask``, ``position_ids`` ``(B, T)``; ``labels`` ``(B,)``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    texts = list(dataset["text"])
    labels = list(dataset["label"]) if "label" in dataset.column_names else None
    prefix, lead, suffix = prompt.parts(tokenizer)
    batches = []
    for start in range(0, len(texts), batch_size):
        rows = [prefix + text_ids(tokenizer, lead + t, max_text_tokens) + suffix
                for t in texts[start:start + batch_size]]
        batch = left_padded(rows, pad_id(tokenizer))
        if labels is not None:
            batch["labels"] = torch.tensor([int(v) for v in labels[start:start + batch_size]], dtype=torch.long)
        batches.append(batch)
    return batches


def zero_shot_lm_logits(model: nn.Module, inputs: Mapping[str, torch.Tensor],
                        label_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Class logits ``(B, C)`` of left-padded prompts: the label words' log-probabilities at the last position
    (a Hydra LM's ensemble distribution: the log of its members' mean softmax)."""
    out = model(**inputs, logits_to_keep=1)
    return label_word_logits(out.logits[:, -1], label_ids)  # (B, V) -> (B, C)


def zero_shot_lm_adapter(model: nn.Module, label_ids: Sequence[Sequence[int]]) -> ModelAdapter:
    """The head adapter of a causal LM (Llama-like or GPT-2) whose logits are the classes' label-word logits
    (:func:`zero_shot_lm_logits`): a classifier to :func:`~hydra_hf.pruning.taylor.taylor_prune` and the circuits.

    Raises:
        TypeError: the model is no causal LM (no ``lm_head``) or has neither decoder layout.
    """
    if not hasattr(model, "lm_head"):
        raise TypeError(f"{type(model).__name__} is not a causal LM (no lm_head); zero-shot prompts need one")
    ids = [list(map(int, group)) for group in label_ids]
    return dataclasses.replace(decoder_adapter(model, task="causal_lm"), task="classification",
                               input_keys=INPUT_KEYS,
                               logits_fn=lambda m, inputs: zero_shot_lm_logits(m, inputs, ids))
