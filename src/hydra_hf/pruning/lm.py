"""Head pruning of decoders on next-token prediction (causal LMs: Llama-like, GPT-2).

Next-token prediction is seen as classification over the vocabulary, so that Taylor scores and
circuit search run unchanged:

- :func:`lm_batches` / :func:`lm_batches_from_ids` build right-padded batches whose ``labels`` are
  the next-token targets of every *valid* position (tokens ``t`` and ``t+1`` both real), flattened
  row-major: ``labels = input_ids[:, 1:][next_token_mask(attention_mask)]``, ``(N_valid,)``;
- :func:`causal_lm_adapter` returns those positions' logits, flattened the same way, ``(N_valid, V)``
  (:func:`~hydra_hf.families.adapters.next_token_logits`).

Then :func:`~hydra_hf.pruning.taylor.taylor_prune` scores heads with the gradient of the mean
next-token cross-entropy, and :func:`~hydra_hf.pruning.circuits.circuit_prune` (which picks
:class:`LMGatedEvaluator` for ``adapter.task == "causal_lm"``) scores circuits with

- ``"acc"``: next-token accuracy over every valid ID position (micro-average over tokens);
- ``"ood"``: AUROC, ID sequences positive, of each *sequence's* mean per-token maximum softmax
  probability (higher = more ID) — the OOD decision is made per sequence, not per token;
- ``"avg"``: the mean of the two.

Budgets are those of :class:`~hydra_hf.pruning.budget.Budget` (``heads_per_layer=K`` or
``remove=N``), counted in query heads. Grouped-query attention: a member keeps query heads; a
key/value head stays while any of its query heads is kept (:func:`~hydra_hf.masks.kept_kv_heads`).

Example::

    batches = lm_batches(tokenizer, texts, max_length=128, batch_size=8)
    adapter = causal_lm_adapter(model)
    result = taylor_prune(adapter, batches, Budget(heads_per_layer=4))
    result = circuit_prune(adapter, batches, ood_batches, Budget(heads_per_layer=4), score="avg")
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..families.adapters import ModelAdapter, decoder_adapter, next_token_mask
from ..masks import kept_kv_heads
from ..metrics import ood_auroc
from .gates import HeadGates
from .layout import HeadLayout
from .scoring import CIRCUIT_SCORES, Batch

logger = logging.getLogger(__name__)

__all__ = [
    "LMGatedEvaluator",
    "causal_lm_adapter",
    "kept_kv_heads",
    "lm_batches",
    "lm_batches_from_ids",
    "lm_circuit_score",
    "next_token_labels",
    "sequence_mean",
]


# ------------------------------------------------------------------------------------------ data
def next_token_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The next-token targets of every valid position, row-major: ``input_ids[:, 1:][next_token_mask]``.

    Shape:
        input_ids, attention_mask: ``(B, T)``; returns ``(N_valid,)`` long.
    """
    return input_ids[:, 1:][next_token_mask(attention_mask)]


def lm_batches_from_ids(
    sequences: Sequence[Sequence[int]], *, max_length: int, batch_size: int, pad_token_id: int = 0
) -> list[dict[str, torch.Tensor]]:
    """Next-token batches from token id lists (no tokenizer needed).

    Every sequence is cut to ``max_length`` tokens; sequences of fewer than 2 tokens predict nothing
    and are dropped (logged). Batches keep the order of ``sequences``, ``batch_size`` per batch, right
    padded with ``pad_token_id`` to the batch's longest sequence.

    Returns:
        ``[{"input_ids": (B, T), "attention_mask": (B, T), "labels": (N_valid,)}, ...]`` with
        ``labels`` = :func:`next_token_labels` (``N_valid = sum_b (len_b - 1)``).
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (a token and its successor), got {max_length}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    kept = [list(s)[:max_length] for s in sequences]
    short = sum(len(s) < 2 for s in kept)
    if short:
        logger.info("dropped %d of %d sequences with fewer than 2 tokens", short, len(kept))
    kept = [s for s in kept if len(s) >= 2]
    batches = []
    for start in range(0, len(kept), batch_size):
        rows = kept[start : start + batch_size]
        T = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), T), pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(len(rows), T, dtype=torch.long)
        for b, row in enumerate(rows):
            input_ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[b, : len(row)] = 1
        batches.append(
            {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "labels": next_token_labels(input_ids, attention_mask),
            }
        )
    return batches


def lm_batches(
    tokenizer: Any, texts: Sequence[str], *, max_length: int, batch_size: int, add_special_tokens: bool = True
) -> list[dict[str, torch.Tensor]]:
    """Next-token batches of ``texts`` (see :func:`lm_batches_from_ids`), tokenized by ``tokenizer``.

    Padding uses the tokenizer's pad token, else its EOS token, else 0 (padded positions are masked
    and never targets, so the id does not matter).
    """
    ids = tokenizer(list(texts), truncation=True, max_length=max_length, add_special_tokens=add_special_tokens)[
        "input_ids"
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else getattr(tokenizer, "eos_token_id", None)
    return lm_batches_from_ids(
        ids, max_length=max_length, batch_size=batch_size, pad_token_id=pad if pad is not None else 0
    )


def causal_lm_adapter(model: nn.Module) -> ModelAdapter:
    """The next-token adapter of a causal LM with Llama's layout (Llama, Mistral, Qwen2, Qwen3) or
    GPT-2's: logits ``(N_valid, V)`` at the valid positions of a batch, ``task="causal_lm"``.

    Raises:
        TypeError: the model has no ``lm_head`` or neither layout.
    """
    if not hasattr(model, "lm_head"):
        raise TypeError(
            f"{type(model).__name__} is not a causal LM (no lm_head); use ...ForCausalLM / GPT2LMHeadModel"
        )
    return decoder_adapter(model, task="causal_lm")


# ------------------------------------------------------------------------------------- scoring
def sequence_mean(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean of per-position values given row-major over the valid next-token positions.

    Rows with no valid position are left out.

    Shape:
        values: ``(N_valid,)``; attention_mask: ``(B, T)``; returns ``(B',)``, ``B'`` = rows with at
        least one valid position.
    """
    counts = next_token_mask(attention_mask).sum(dim=1)  # (B,)
    if int(counts.sum()) != values.numel():
        raise ValueError(f"{values.numel()} values for {int(counts.sum())} valid positions")
    rows = torch.repeat_interleave(torch.arange(len(counts)), counts.cpu())  # (N_valid,)
    sums = torch.zeros(len(counts), dtype=values.dtype).index_add_(0, rows, values.cpu())
    present = counts.cpu() > 0
    return sums[present] / counts.cpu()[present].to(values.dtype)


def lm_circuit_score(accuracy: float, msp_id: torch.Tensor | None, msp_ood: torch.Tensor | None, score: str) -> float:
    """The circuit score ``S`` of a causal LM from its next-token accuracy and per-sequence mean MSPs.

    Shape:
        msp_id: ``(S_id,)``, msp_ood: ``(S_ood,)`` (per-sequence means; unused for ``"acc"``).
    """
    if score not in CIRCUIT_SCORES:
        raise ValueError(f"unknown circuit score {score!r}; choose one of {list(CIRCUIT_SCORES)}")
    if score == "acc":
        return accuracy
    if msp_id is None or msp_ood is None:
        raise ValueError(f"the circuit score {score!r} needs OOD data (--ood-data)")
    ood = ood_auroc(msp_id, msp_ood)
    return ood if score == "ood" else (accuracy + ood) / 2


class LMGatedEvaluator:
    """Circuit evaluator of a causal LM (the :class:`~hydra_hf.pruning.circuits.Evaluator` protocol):
    re-runs the model with :class:`HeadGates` per candidate and scores next-token accuracy and the
    sequence-level MSP AUROC (module docstring).

    Args:
        adapter: a ``task="causal_lm"`` adapter (:func:`causal_lm_adapter`).
        id_batches: ID batches (:func:`lm_batches`; ``labels`` are read, or derived from ``input_ids``).
        ood_batches: OOD batches (needed for ``"ood"`` / ``"avg"``).
        tower: the tower (``None``: the only one).
    """

    def __init__(self, adapter: ModelAdapter, id_batches: Sequence[Batch], ood_batches: Sequence[Batch] | None, *,
                 tower: str | None = None) -> None:
        if adapter.task != "causal_lm":
            raise ValueError(
                f"LMGatedEvaluator needs a causal LM adapter (task 'causal_lm'), got task {adapter.task!r}"
            )
        self.adapter = adapter
        self.layout = HeadLayout.of(adapter, tower)
        self.id_batches = list(id_batches)
        self.ood_batches = list(ood_batches) if ood_batches is not None else None

    @torch.inference_mode()
    def statistics(
        self, hg: HeadGates, gates: torch.Tensor, batches: Sequence[Batch]
    ) -> tuple[int, int, torch.Tensor]:
        """``(correct, total, msp)`` of the model with ``gates``: next-token argmax hits, valid positions,
        and each sequence's mean per-token MSP ``(S,)`` float64."""
        hg.set(self.layout.split(gates))
        correct, total, msp = 0, 0, []
        for b in batches:
            logits = self.adapter.logits(b).double().cpu()  # (N_valid, V)
            labels = b["labels"] if "labels" in b else next_token_labels(b["input_ids"], b["attention_mask"])
            correct += int((logits.argmax(-1) == labels.cpu()).sum())
            total += len(labels)
            msp.append(sequence_mean(logits.softmax(-1).amax(-1), b["attention_mask"]))
        return correct, total, torch.cat(msp) if msp else torch.empty(0, dtype=torch.float64)

    def _scores(self, hg: HeadGates, gates: torch.Tensor, scores: Sequence[str]) -> dict[str, float]:
        correct, total, msp_id = self.statistics(hg, gates, self.id_batches)
        if total == 0:
            raise ValueError("the ID batches have no valid next-token position")
        msp_ood = None
        if any(s != "acc" for s in scores):
            if not self.ood_batches:
                raise ValueError("the circuit scores 'ood' / 'avg' need OOD data (--ood-data)")
            msp_ood = self.statistics(hg, gates, self.ood_batches)[2]
        return {s: lm_circuit_score(correct / total, msp_id, msp_ood, s) for s in scores}

    def evaluate(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], score: str, *, top: int = 1
    ) -> torch.Tensor:
        """Score of the model with ``gates`` and, in turn, each candidate head also off. Shape ``(C,)``."""
        return self.evaluate_many(gates, candidates, (score,), top=top)[score]

    def evaluate_many(
        self, gates: torch.Tensor, candidates: Sequence[tuple[int, int]], scores: Sequence[str], *, top: int = 1
    ) -> dict[str, torch.Tensor]:
        """:meth:`evaluate` for several scores from the same forward passes. ``{score: (C,)}``."""
        out = {score: torch.empty(len(candidates), dtype=torch.float64) for score in scores}
        model = self.adapter.model
        was_training = model.training
        model.eval()
        try:
            with HeadGates(model, adapter=self.adapter) as hg:
                for i, (row, head) in enumerate(candidates):
                    g = gates.clone()
                    g[row, head] = 0.0
                    for score, value in self._scores(hg, g, scores).items():
                        out[score][i] = value
        finally:
            model.train(was_training)
        return out

    def score_of(self, gates: torch.Tensor, score: str) -> float:
        """Score of the model with ``gates`` (no extra ablation)."""
        model = self.adapter.model
        was_training = model.training
        model.eval()
        try:
            with HeadGates(model, adapter=self.adapter) as hg:
                return self._scores(hg, gates, (score,))[score]
        finally:
            model.train(was_training)
