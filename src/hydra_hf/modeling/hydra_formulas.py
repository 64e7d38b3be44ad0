# Shipped with every Hydra Ensemble model folder (remote code): imports only the standard library and torch.
"""The formulas every part of a Hydra Ensemble shares, in one copy: the ensemble's prediction (the log of the
members' mean softmax; the exact logit of their mean sigmoid), its uncertainty (entropies, mutual information)
and the grouped-query rule (which key/value heads a member keeps).

The shipped files import them as siblings (``from .hydra_formulas import entropy``); the hydra_hf library
imports them from here too (``hydra_hf.metrics``, ``hydra_hf.masks``, evaluation, fine-tuning), so that a number
the library reports is the number a loaded folder computes. No input validation here: the public functions
that call these check their inputs. Notation: M members, C classes (V tokens), ``dim`` the member axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "ensemble_log_probs", "ensemble_mutual_information", "ensemble_sigmoid_logits", "entropy", "entropy_of_log_probs",
    "kept_kv_heads", "log_mean_exp", "log_prob_uncertainty", "members_kept_kv_heads",
    "mutual_information_from_entropies",
]


# ------------------------------------------------------------------------------ the ensemble's prediction
def log_mean_exp(log_probs: torch.Tensor, dim: int) -> torch.Tensor:
    """``log(mean_m exp(log_probs))`` over the member axis ``dim``: the log of the members' mean probability.

    Shape:
        log_probs: (..., M, ..., C) -> the same without ``dim``
    """
    return torch.logsumexp(log_probs, dim=dim) - math.log(log_probs.shape[dim])


def ensemble_log_probs(member_logits: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """The ensemble's prediction: log of the mean of the members' softmaxes (computed in float32, returned in
    the logits' dtype). Its softmax is the mean softmax, so a client that applies softmax to ``logits`` gets
    the ensemble's distribution.

    Shape:
        member_logits: (B, M, C) -> (B, C) for ``dim=1``; (B, M, T, V) -> (B, T, V)
    """
    return log_mean_exp(F.log_softmax(member_logits.float(), dim=-1), dim).to(member_logits.dtype)


def ensemble_sigmoid_logits(member_logits: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Multi-label and sigmoid (SigLIP) ensembles: ``logit(mean_m sigmoid(z))`` over the member axis, exact.

    ``log p - log(1 - p)`` with ``log p = logsumexp(logsigmoid(z)) - log M`` and ``log(1 - p) =
    logsumexp(logsigmoid(-z)) - log M``: the ``log M`` cancel, and neither side is rounded, so a mean sigmoid far
    below 1e-7 (SigLIP's zero-shot scores) or far above 1 - 1e-7 keeps its logit, where ``log(p / (1 - p))`` of
    a float32 ``p`` clamped away from 0 and 1 returns the clamp's logit.

    Shape:
        member_logits: (B, M, C) -> (B, C) for ``dim=1``
    """
    z = member_logits.float()
    out = torch.logsumexp(F.logsigmoid(z), dim=dim) - torch.logsumexp(F.logsigmoid(-z), dim=dim)
    return out.to(member_logits.dtype)


# ------------------------------------------------------------------------------ the ensemble's uncertainty
def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last axis, with ``0 * log 0 = 0``.

    Shape:
        probs: (..., C) -> (...)
    """
    probs = probs.clamp(min=0)  # tolerate -1e-7 from float rounding
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def entropy_of_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats over the last axis of log-probabilities; ``-inf`` (a masked class) counts as
    ``0 * log 0 = 0``.

    Shape:
        log_probs: (..., V) -> (...)
    """
    log_probs = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)  # -inf -> finite, so 0 * lp = 0
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def mutual_information_from_entropies(
    predictive_entropy: torch.Tensor, expected_entropy: torch.Tensor
) -> torch.Tensor:
    """The mutual information between the prediction and the member: the entropy of the members' mean minus the
    members' mean entropy (nats; the members' disagreement). It is >= 0 by Jensen's inequality; the clamp
    removes rounding noise (-1e-16)."""
    return (predictive_entropy - expected_entropy).clamp(min=0)


def ensemble_mutual_information(member_probs: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """:func:`mutual_information_from_entropies` of members given as probabilities, the member axis ``dim``.

    Shape:
        member_probs: (N, M, C) -> (N,) for ``dim=1``
    """
    dim = dim % member_probs.dim()
    return mutual_information_from_entropies(
        entropy(member_probs.mean(dim=dim)), entropy(member_probs).mean(dim=dim)
    )


def log_prob_uncertainty(member_log_probs: torch.Tensor, dim: int = 1) -> dict[str, torch.Tensor]:
    """The ensemble's ``log_probs`` (:func:`log_mean_exp`) and its three uncertainties, in nats, from every
    member's log-probabilities (a causal LM's next-token distributions: no probability leaves log space):
    ``predictive_entropy`` (total), ``expected_entropy`` (the members' mean entropy, aleatoric) and
    ``mutual_information`` (epistemic).

    Shape:
        member_log_probs: (..., M, ..., V) -> ``log_probs`` the same without ``dim``; the entropies also
        without the last axis
    """
    dim = dim % member_log_probs.dim()
    log_probs = log_mean_exp(member_log_probs, dim)
    total = entropy_of_log_probs(log_probs)
    expected = entropy_of_log_probs(member_log_probs).mean(dim=dim)
    return {
        "log_probs": log_probs,
        "predictive_entropy": total,
        "expected_entropy": expected,
        "mutual_information": mutual_information_from_entropies(total, expected),
    }


# ------------------------------------------------------------------------------ grouped-query attention
def kept_kv_heads(kept_query_heads: Iterable[int], num_heads: int, num_key_value_heads: int) -> list[int]:
    """The key/value heads a member keeps in one layer under grouped-query attention: query head ``h`` reads
    key/value head ``h // (num_heads // num_key_value_heads)`` (transformers' ``repeat_kv``), and a key/value
    head stays while any query head of its group is kept. With ``num_key_value_heads == num_heads`` this is
    ``sorted(kept_query_heads)``. ``kept_kv_heads([0, 5], 8, 2) == [0, 1]``; ``kept_kv_heads([0, 1], 8, 2) ==
    [0]``."""
    group = num_heads // num_key_value_heads
    return sorted({int(h) // group for h in kept_query_heads})


def members_kept_kv_heads(
    kept_heads: Sequence[Sequence[Iterable[int]]], num_heads: int, num_key_value_heads: int
) -> list[list[list[int]]]:
    """:func:`kept_kv_heads` of every member and layer: ``out[m][l]`` = the key/value heads member m keeps in
    layer l."""
    return [[kept_kv_heads(layer, num_heads, num_key_value_heads) for layer in member] for member in kept_heads]
