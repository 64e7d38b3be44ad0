"""Next-token metrics of causal language models, single or Hydra ensembles, computed batch by batch.

A causal LM predicts, at every position ``t`` of a sequence, the token at ``t + 1``. Conventions
(those of :mod:`hydra_hf.metrics`, per token instead of per sample):

- ``member_logits (B, M, T, V)``: the ``M`` members' next-token logits (log-probabilities are
  accepted too: ``log_softmax`` leaves them unchanged); ``(B, T, V)`` is one model, ``M = 1``. The
  ensemble's distribution is the mean of the members' softmaxes (a Hydra causal LM's ``logits`` is
  its log).
- ``targets (B, T)``: the next tokens, already shifted (:func:`shift_for_next_token`), in ``[0, V)``
  wherever ``mask`` is true; anything (e.g. ``-100``) elsewhere.
- ``mask (B, T)``: which positions carry a prediction to score (padding and the last real token of
  each sequence do not). Default: ``targets >= 0``.
- Entropies are in nats; sequence-level OOD scores are "higher = more in-distribution".

Memory: the vocabulary makes a ``(N, V)`` array of a whole data set too large to keep (``V`` is
32k-150k), so nothing here holds one. :func:`next_token_uncertainty` works on the valid positions
of one batch in chunks of at most ``chunk_elements`` logits (``positions x M x V``), and
:class:`CausalLMAccumulator` keeps only a few numbers per token and per sequence across batches.
Calibration uses :func:`hydra_hf.metrics.ece_from_confidence` (the bins of :func:`hydra_hf.metrics.ece`)
on the kept per-token confidences; :mod:`hydra_hf.evaluation.causal_lm` gives the sequence scores to
:func:`hydra_hf.metrics.ood_report` (AUROC, FPR@95).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ..modeling.hydra_formulas import log_prob_uncertainty
from . import classification as metrics
from .scores import SEQUENCE_SCORES, TOKEN_QUANTITIES, TOKEN_SCORES

__all__ = [
    "CHUNK_ELEMENTS",
    "TOKEN_QUANTITIES",
    "SEQUENCE_SCORES",
    "CausalLMAccumulator",
    "as_member_logits",
    "shift_for_next_token",
    "next_token_uncertainty",
    "sequence_means",
    "sequence_scores",
    "token_scores",
    "perplexity",
    "next_token_accuracy",
    "token_ece",
]

CHUNK_ELEMENTS = 2**25
"""Default bound on ``positions x M x V`` logits processed at once (128 MiB per float32 copy)."""

def _exp(x: float) -> float:
    """``exp(x)``, ``inf`` instead of an OverflowError (a mean NLL above ~709 nats)."""
    return math.exp(x) if x < 709.0 else float("inf")


def _check_logits(member_logits: Any) -> torch.Tensor:
    if not isinstance(member_logits, torch.Tensor):
        raise TypeError(
            f"member_logits must be a torch.Tensor, got {type(member_logits).__name__}; wrap it with torch.as_tensor"
        )
    if not member_logits.is_floating_point():
        raise TypeError(
            f"member_logits must be floating point, got dtype {member_logits.dtype}; pass logits, not token ids"
        )
    if member_logits.ndim == 3:
        return member_logits.unsqueeze(1)  # (B, 1, T, V): one model
    if member_logits.ndim != 4:
        raise ValueError(
            f"member_logits must have shape (B, M, T, V) or (B, T, V), got shape {tuple(member_logits.shape)}"
        )
    if 0 in member_logits.shape:
        raise ValueError(f"member_logits is empty (shape {tuple(member_logits.shape)}); pass at least one token")
    return member_logits


def as_member_logits(member_logits: torch.Tensor) -> torch.Tensor:
    """``(B, M, T, V)`` unchanged, ``(B, T, V)`` as one member ``(B, 1, T, V)`` (a view)."""
    return _check_logits(member_logits)


def _check_targets(targets: Any, mask: Any, b: int, t: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        kind = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(
            f"targets must be an integer torch.Tensor of next-token ids, got {kind}; pass input_ids[:, 1:]"
        )
    if tuple(targets.shape) != (b, t):
        raise ValueError(
            f"targets has shape {tuple(targets.shape)} but the logits need (B, T) = ({b}, {t}); shift both with "
            "shift_for_next_token"
        )
    if mask is None:
        mask = targets >= 0
    elif not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (b, t):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a (B, T) = ({b}, {t}) tensor, got {shape}; pass attention_mask[:, 1:]")
    mask = mask.to(device=targets.device, dtype=torch.bool)
    valid_targets = targets[mask]
    if valid_targets.numel() and (int(valid_targets.min()) < 0 or int(valid_targets.max()) >= v):
        raise ValueError(
            f"targets at valid positions must be token ids in [0, {v}), got values in "
            f"[{int(valid_targets.min())}, {int(valid_targets.max())}]; mask out padding or check the vocabulary size"
        )
    return targets, mask


def shift_for_next_token(
    member_logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Align predictions with the tokens they predict: position ``t`` scores token ``t + 1``.

    A position is valid when both its own token and the next one are real (attention mask 1), so
    right and left padding both work.

    Shape:
        member_logits: (B, M, T, V) or (B, T, V); input_ids: (B, T); attention_mask: (B, T) or None
        -> (member_logits (B, M, T-1, V) (a view), targets (B, T-1), mask (B, T-1) bool)
    """
    logits = _check_logits(member_logits)
    b, _, t, _ = logits.shape
    if not isinstance(input_ids, torch.Tensor) or tuple(input_ids.shape) != (b, t):
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a (B, T) = ({b}, {t}) tensor matching the logits, got {shape}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    elif tuple(attention_mask.shape) != (b, t):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {(b, t)}; they must match"
        )
    real = attention_mask.to(torch.bool)
    return logits[:, :, :-1], input_ids[:, 1:], real[:, 1:] & real[:, :-1]


def _chunk_quantities(x: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every per-token quantity for ``c`` positions of logits ``x (c, M, V)`` and targets ``(c,)``."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    lp = F.log_softmax(x.to(dtype), dim=-1)  # (c, M, V) members' log-probs
    lp = lp.clamp(min=torch.finfo(dtype).min)  # -inf (masked vocabulary) -> finite, so 0 * lp = 0
    member_pred = lp.argmax(dim=-1)  # (c, M)
    u = log_prob_uncertainty(lp, dim=1)  # the ensemble's log of the mean softmax (c, V) and entropies (c,)
    del lp
    ens_lp = u["log_probs"]
    conf, pred = ens_lp.exp().max(dim=-1)  # (c,)
    nll = -ens_lp.gather(1, target[:, None]).squeeze(1)  # (c,)
    return {
        "nll": nll,
        "msp": conf,
        "predictive_entropy": u["predictive_entropy"],
        "expected_entropy": u["expected_entropy"],
        "mutual_information": u["mutual_information"],
        "disagreement": (member_pred != pred[:, None]).to(dtype).mean(dim=1),
        "correct": pred == target,
        "prediction": pred,
        "member_predictions": member_pred,
    }


@torch.no_grad()
def next_token_uncertainty(
    member_logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> dict[str, torch.Tensor]:
    """Per-token prediction, loss and uncertainty of an ensemble's next-token distributions.

    The ensemble distribution is ``p = mean_m softmax(member_logits[:, m])``. Per valid position:

    - ``nll``: ``-log p[target]``; ``msp``: ``max_v p_v``; ``correct``: ``argmax p == target``;
    - ``predictive_entropy``: ``H(p)``; ``expected_entropy``: ``mean_m H(p_m)``;
      ``mutual_information``: their difference (0 when the members agree, 0 for ``M = 1``);
    - ``disagreement``: fraction of members whose top token differs from the ensemble's;
    - ``prediction``: the ensemble's top token; ``member_predictions``: each member's.

    Only the valid positions are computed, ``chunk_elements // (M x V)`` (at least one) at a time,
    in float32 (float64 for float64 input), so the memory used beyond the input is bounded by a few
    chunks whatever ``B``, ``T`` and ``V``.

    Shape:
        member_logits: (B, M, T, V) or (B, T, V); targets: (B, T) int; mask: (B, T) bool or None
        (default ``targets >= 0``)
        -> dict of (B, T) tensors (float quantities 0, ``correct`` False and predictions -1 where
        ``mask`` is false), ``member_predictions`` (B, M, T), and ``mask`` (B, T) bool.
    """
    logits = _check_logits(member_logits)
    b, m, t, v = logits.shape
    targets, mask = _check_targets(targets, mask, b, t, v)
    if chunk_elements < 1:
        raise ValueError(f"chunk_elements must be >= 1, got {chunk_elements}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    device = logits.device
    out: dict[str, torch.Tensor] = {k: torch.zeros(b, t, dtype=dtype, device=device) for k in TOKEN_QUANTITIES}
    out["correct"] = torch.zeros(b, t, dtype=torch.bool, device=device)
    out["prediction"] = torch.full((b, t), -1, dtype=torch.int64, device=device)
    out["member_predictions"] = torch.full((b, m, t), -1, dtype=torch.int64, device=device)
    mask, targets = mask.to(device), targets.to(device)
    rows, cols = torch.nonzero(mask, as_tuple=True)  # (n,), (n,) the valid positions
    step = max(1, chunk_elements // (m * v))
    for start in range(0, rows.numel(), step):
        r, c = rows[start:start + step], cols[start:start + step]
        x = logits[r, :, c, :]  # (c, M, V): a copy of this chunk only
        q = _chunk_quantities(x, targets[r, c].to(device=device, dtype=torch.int64))
        for k in TOKEN_QUANTITIES:
            out[k][r, c] = q[k]
        out["correct"][r, c] = q["correct"]
        out["prediction"][r, c] = q["prediction"]
        out["member_predictions"][r, :, c] = q["member_predictions"]
    out["mask"] = mask
    return out


def sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over each sequence's valid positions; NaN for a sequence with none.

    Shape:
        values: (B, T); mask: (B, T) bool -> (B,) float64
    """
    if values.shape != mask.shape or values.ndim != 2:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must both have shape (B, T)")
    w = mask.to(torch.float64)
    count = w.sum(dim=1)
    total = (values.to(torch.float64) * w).sum(dim=1)
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, float("nan")))


def token_scores(tokens: Mapping[str, torch.Tensor], num_members: int) -> dict[str, torch.Tensor]:
    """The token-level OOD scores (:data:`hydra_hf.metrics.TOKEN_SCORES`) of one batch, higher = more ID:
    ``sign x`` the per-token quantity each reads. ``mutual_information`` only when ``num_members > 1``.

    Shape:
        tokens: the output of :func:`next_token_uncertainty` for (B, T) positions -> dict of (B, T)
    """
    return {name: score.sign * tokens[score.reads] for name, score in TOKEN_SCORES.items()
            if score.single_model or num_members > 1}


def sequence_scores(tokens: Mapping[str, torch.Tensor], num_members: int) -> dict[str, torch.Tensor]:
    """The sequence-level OOD scores (:data:`hydra_hf.metrics.SEQUENCE_SCORES`) of one batch, higher =
    more ID: the mean of the token score of the same name over each sequence's valid tokens.

    ``mutual_information`` only when ``num_members > 1``.

    Shape:
        tokens: the output of :func:`next_token_uncertainty` for (B, T) positions -> dict of (B,) float64
        (NaN for a sequence without a valid position).
    """
    per_token = token_scores(tokens, num_members)
    return {name: sequence_means(per_token[name], tokens["mask"]) for name in SEQUENCE_SCORES if name in per_token}


def _valid(values: torch.Tensor, mask: torch.Tensor, what: str) -> torch.Tensor:
    if values.shape != mask.shape:
        raise ValueError(f"{what} has shape {tuple(values.shape)} but mask has {tuple(mask.shape)}; they must match")
    kept = values[mask.to(torch.bool)]
    if kept.numel() == 0:
        raise ValueError(
            f"no valid token to compute {what} on (the mask is all false); pass sequences of at least 2 tokens"
        )
    return kept


def perplexity(token_nll: torch.Tensor, mask: torch.Tensor) -> float:
    """``exp(mean token NLL)`` over the valid tokens (all sequences pooled, not a mean of per-sequence
    perplexities). A uniform distribution over ``V`` tokens has perplexity ``V``.

    Shape:
        token_nll: (B, T) (or any shape); mask: same shape, bool.
    """
    return _exp(float(_valid(token_nll, mask, "perplexity").to(torch.float64).mean()))


def next_token_accuracy(correct: torch.Tensor, mask: torch.Tensor) -> float:
    """Fraction of valid positions whose top-1 token is the next token.

    Shape:
        correct: (B, T) bool; mask: (B, T) bool.
    """
    return float(_valid(correct, mask, "next-token accuracy").to(torch.float64).mean())


def token_ece(confidence: torch.Tensor, correct: torch.Tensor, mask: torch.Tensor, n_bins: int = 15) -> float:
    """Per-token ECE: :func:`hydra_hf.metrics.ece` over the valid positions, each token a sample
    (top-1 confidence ``msp`` against ``correct``).

    Shape:
        confidence: (B, T); correct: (B, T) bool; mask: (B, T) bool.
    """
    return metrics.ece_from_confidence(
        _valid(confidence, mask, "token ECE").cpu(), _valid(correct, mask, "token ECE").cpu(), n_bins
    )


class CausalLMAccumulator:
    """Streams next-token predictions batch by batch and keeps O(tokens + sequences) numbers.

    Per valid token it keeps the confidence and correctness (for the ECE) and running sums; per
    sequence the mean of every :data:`TOKEN_QUANTITIES` entry (in the order the batches came).
    Never an ``(N, V)`` array.

    Example::

        acc = CausalLMAccumulator()
        for batch in batches:
            logits, targets, mask = shift_for_next_token(model(**batch).member_logits, batch["input_ids"],
                                                         batch["attention_mask"])
            acc.update(logits, targets, mask)
        acc.summary()  # perplexity, accuracy, nll, ece, ...
        acc.sequence_scores()  # {"msp": (N_seq,), ...}
    """

    def __init__(self, chunk_elements: int = CHUNK_ELEMENTS) -> None:
        self.chunk_elements = chunk_elements
        self.num_members: int | None = None
        self._confidence: list[torch.Tensor] = []
        self._correct: list[torch.Tensor] = []
        self._token_sums = dict.fromkeys(TOKEN_QUANTITIES, 0.0)
        self._num_correct = 0
        self.num_tokens = 0
        self._sequence: dict[str, list[torch.Tensor]] = {k: [] for k in TOKEN_QUANTITIES}

    @torch.no_grad()
    def update(
        self, member_logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Add one batch; returns its :func:`next_token_uncertainty` dict.

        Shape:
            member_logits: (B, M, T, V) or (B, T, V); targets, mask: (B, T) (already shifted).
        """
        logits = _check_logits(member_logits)
        m = logits.shape[1]
        if self.num_members is None:
            self.num_members = m
        elif m != self.num_members:
            raise ValueError(
                f"this batch has M={m} members but earlier batches had {self.num_members}; evaluate one model per "
                "accumulator"
            )
        tokens = next_token_uncertainty(logits, targets, mask, self.chunk_elements)
        valid = tokens["mask"]
        self._confidence.append(tokens["msp"][valid].to("cpu", torch.float64))
        self._correct.append(tokens["correct"][valid].cpu())
        self.num_tokens += int(valid.sum())
        self._num_correct += int(tokens["correct"][valid].sum())
        for k in TOKEN_QUANTITIES:
            self._token_sums[k] += float(tokens[k][valid].to(torch.float64).sum())
            self._sequence[k].append(sequence_means(tokens[k], valid).cpu())
        return tokens

    @property
    def num_sequences(self) -> int:
        return sum(x.numel() for x in self._sequence["nll"])

    def sequence_means(self) -> dict[str, torch.Tensor]:
        """Per sequence, the mean of each :data:`TOKEN_QUANTITIES` entry: dict of (N_seq,) float64
        (NaN for a sequence without a valid position)."""
        empty = torch.zeros(0, dtype=torch.float64)
        return {k: torch.cat(v) if v else empty for k, v in self._sequence.items()}

    def sequence_scores(self) -> dict[str, torch.Tensor]:
        """The :data:`SEQUENCE_SCORES` of every sequence so far (higher = more ID): dict of (N_seq,)
        float64; ``mutual_information`` only for ``M > 1``."""
        means = self.sequence_means()
        return {
            name: score.sign * means[score.reads]
            for name, score in SEQUENCE_SCORES.items()
            if score.single_model or (self.num_members or 1) > 1
        }

    def summary(self, n_bins: int = 15) -> dict[str, float]:
        """Token-level numbers over every valid token so far, as python floats.

        Keys: ``perplexity``, ``nll`` (mean token NLL, nats), ``accuracy``, ``ece`` (``n_bins`` bins),
        the token means of ``predictive_entropy``, ``expected_entropy``, ``mutual_information``,
        ``disagreement`` and ``msp``, and the counts ``num_tokens``, ``num_sequences``, ``num_members``.
        """
        if self.num_tokens == 0:
            raise ValueError("no valid token was seen; pass sequences of at least 2 tokens (one prediction each)")
        n = self.num_tokens
        mean_nll = self._token_sums["nll"] / n
        return {
            "perplexity": _exp(mean_nll),
            "nll": mean_nll,
            "accuracy": self._num_correct / n,
            "ece": metrics.ece_from_confidence(torch.cat(self._confidence), torch.cat(self._correct), n_bins),
            **{k: self._token_sums[k] / n for k in TOKEN_QUANTITIES if k != "nll"},
            "num_tokens": n,
            "num_sequences": self.num_sequences,
            "num_members": self.num_members,
        }
