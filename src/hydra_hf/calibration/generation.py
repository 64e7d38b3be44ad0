"""Abstention thresholds for a Hydra causal LM's ``generate_with_uncertainty``, fitted on in-distribution
texts.

Each text is scored as ``score_generated`` scores a continuation (its first token the prompt, every
later token's next-token distribution): per token the predictive entropy or the members' mutual
information, per sequence their mean. ``sequence_threshold`` is the split conformal quantile of the n
texts' sequence scores (the ``ceil((n + 1)(1 - alpha))``-th smallest): a new text exchangeable with them
is refused with probability at most ``alpha``. ``token_threshold`` is the same quantile of all the
texts' token scores; tokens of one text are not exchangeable with each other, so about ``alpha`` of
in-distribution tokens abstain, without a guarantee. Generated continuations are the model's own
samples, not such texts: on them the thresholds are reference levels, not guarantees.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..errors import HydraInputError
from ..modeling.hydra_decoder import GENERATION_SCORES
from ..version import __version__
from .conformal import check_alpha, conformal_quantile

__all__ = ["GENERATION_SCORES", "fit_generation_abstention", "text_token_scores"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def text_token_scores(model: nn.Module, tokenizer: Any, texts: Sequence[str], score: str, *, max_length: int = 128,
                      batch_size: int = 8) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(sequence scores (n,), [token scores (T_i - 1,) per text])`` of ``texts``, scored as
    ``score_generated`` scores a continuation of the first token. Texts of equal length share a batch
    (no padding)."""
    if score not in GENERATION_SCORES:
        raise HydraInputError(f"score {score!r} is not one of {list(GENERATION_SCORES)} for a causal LM")
    ids = [tokenizer(text, truncation=True, max_length=max_length)["input_ids"] for text in texts]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(ids):
        if len(row) >= 2:
            by_length[len(row)].append(i)
    device = next(model.parameters()).device
    sequence, tokens = torch.full((len(ids),), float("nan"), dtype=torch.float64), [torch.empty(0)] * len(ids)
    for length, members in by_length.items():
        for start in range(0, len(members), batch_size):
            chunk = members[start:start + batch_size]
            batch = torch.tensor([ids[i] for i in chunk], device=device)  # (B, T)
            out = model.score_generated(batch, 1, torch.ones(len(chunk), 1, dtype=torch.long, device=device),
                                        eos_token_id=[])  # every token counts: none is after an end of sequence
            values = out[GENERATION_SCORES[score]].double().cpu()  # (B, T - 1)
            for row, i in enumerate(chunk):
                tokens[i] = values[row]
                sequence[i] = values[row].mean()
    kept = ~torch.isnan(sequence)
    if not bool(kept.any()):
        raise HydraInputError("no text has 2 tokens or more; give in-distribution texts to calibrate on")
    return sequence[kept], [t for t, k in zip(tokens, kept.tolist()) if k]


def fit_generation_abstention(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, alpha: float = 0.1,
                              score: str = "mi", max_length: int = 128, batch_size: int = 8) -> dict[str, Any]:
    """What ``config.calibration`` of a causal LM stores: ``token_threshold`` and ``sequence_threshold``
    on ``score`` (``entropy`` or ``mi``), fitted on in-distribution ``texts`` (see the module docstring)."""
    check_alpha(alpha)
    sequence, tokens = text_token_scores(model, tokenizer, texts, score, max_length=max_length, batch_size=batch_size)
    return {
        "task": "causal_lm", "score": score, "alpha": float(alpha), "n": int(sequence.numel()),
        "sequence_threshold": conformal_quantile(sequence, alpha),
        "token_threshold": conformal_quantile(torch.cat(tokens), alpha),
        "n_tokens": int(sum(t.numel() for t in tokens)), "hydra_hf_version": __version__,
    }
