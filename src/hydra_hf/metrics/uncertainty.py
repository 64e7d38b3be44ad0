"""The uncertainty maths the library shares: entropies, an ensemble's mutual information, and the
logit of a multi-label ensemble's mean sigmoid.

One copy for hydra_hf (:mod:`hydra_hf.metrics.classification`, :mod:`hydra_hf.metrics.causal_lm`).
The shipped modeling files keep their own copies (they import only torch and transformers:
``pipeline_hydra._entropy`` / ``uncertainty_from_member_logits``, ``hydra_decoder.token_uncertainty``,
``modeling_hydra_siglip.ensemble_sigmoid_logits``); ``tests/metrics/test_uncertainty_copies.py`` holds them
equal to these on random inputs. No input validation here: the public metrics check their inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["ensemble_mutual_information", "ensemble_sigmoid_logits", "entropy", "entropy_of_log_probs"]


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last dimension, with ``0 * log 0 = 0``.

    Shape:
        probs: (..., C) -> (...)
    """
    probs = probs.clamp(min=0)  # tolerate -1e-7 from float rounding
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def entropy_of_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last dimension of log-probabilities; ``-inf`` (a masked class)
    counts as ``0 * log 0 = 0``.

    Shape:
        log_probs: (..., V) -> (...)
    """
    log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)  # -inf -> finite, so 0 * lp = 0
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def ensemble_mutual_information(member_probs: torch.Tensor) -> torch.Tensor:
    """Entropy of the members' mean minus the members' mean entropy (nats), clamped at 0.

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mi = entropy(member_probs.mean(dim=1)) - entropy(member_probs).mean(dim=1)
    return mi.clamp(min=0)  # removes -1e-16 rounding noise; MI >= 0 by Jensen


def ensemble_sigmoid_logits(member_logits: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """``logit(mean_m sigmoid(z))`` over the member axis ``dim``, exact (no clamping).

    ``log p - log(1 - p)`` with ``log p = logsumexp(logsigmoid(z)) - log M`` and ``log(1 - p) =
    logsumexp(logsigmoid(-z)) - log M``; the ``log M`` cancel, so probabilities far below 1e-7 (SigLIP's
    zero-shot scores) keep their logit.

    Shape:
        member_logits: (B, M, C) -> (B, C) for ``dim=1``
    """
    z = member_logits.float()
    out = torch.logsumexp(F.logsigmoid(z), dim=dim) - torch.logsumexp(F.logsigmoid(-z), dim=dim)
    return out.to(member_logits.dtype)
