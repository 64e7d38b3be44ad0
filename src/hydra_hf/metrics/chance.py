"""Chance levels of a classification task: what a model that learned nothing scores on it.

A model that ignores its input and predicts the class frequencies reaches the *majority rate* in accuracy
and, in negative log-likelihood, the entropy of the class frequencies (``ln C`` for balanced classes). A
fine-tuning run that ends near either learned next to nothing, and a comparison against such a baseline
says nothing about the method compared: :func:`near_chance` names the condition in words, and
``hydra-hf finetune`` (a warning) and ``hydra-hf evaluate`` / the model card (a marked comparison) use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["NEAR_CHANCE_ACCURACY_MARGIN", "NEAR_CHANCE_NLL_FRACTION", "chance_levels", "near_chance"]

NEAR_CHANCE_ACCURACY_MARGIN = 0.05
"""Accuracy at most this far above the majority rate is near chance (5 points)."""
NEAR_CHANCE_NLL_FRACTION = 0.95
"""NLL (or training loss) at least this fraction of the class-frequency entropy is near chance."""


def chance_levels(labels: Sequence[int] | torch.Tensor, num_classes: int | None = None) -> dict[str, Any]:
    """The chance levels of labelled data.

    Args:
        labels: ``(N,)`` integer classes.
        num_classes: the task's classes (default: the largest label + 1).

    Returns:
        ``{"classes", "examples", "majority_rate", "chance_nll", "uniform_nll"}``: the share of the most
        frequent class, the entropy of the class frequencies (nats) and ``ln C``.
    """
    labels = torch.as_tensor(labels, dtype=torch.long).reshape(-1)
    if labels.numel() == 0:
        raise ValueError("chance_levels needs at least one label")
    classes = int(num_classes) if num_classes is not None else int(labels.max()) + 1
    freq = torch.bincount(labels, minlength=classes).double() / labels.numel()  # (C,)
    nonzero = freq[freq > 0]
    return {
        "classes": classes,
        "examples": int(labels.numel()),
        "majority_rate": float(freq.max()),
        "chance_nll": float(-(nonzero * nonzero.log()).sum()),
        "uniform_nll": math.log(classes),
    }


def near_chance(levels: Mapping[str, Any], *, accuracy: float | None = None, nll: float | None = None) -> str | None:
    """Why a model's ``accuracy`` / ``nll`` (or training loss) are near the chance ``levels`` of
    :func:`chance_levels`, in words, or None when neither is.

    Near chance: accuracy at most :data:`NEAR_CHANCE_ACCURACY_MARGIN` above the majority rate, or NLL at
    least :data:`NEAR_CHANCE_NLL_FRACTION` of the entropy of the class frequencies.
    """
    reasons = []
    if accuracy is not None and accuracy <= levels["majority_rate"] + NEAR_CHANCE_ACCURACY_MARGIN:
        reasons.append(f"accuracy {accuracy:.3f} is within {NEAR_CHANCE_ACCURACY_MARGIN:g} of the majority rate "
                       f"{levels['majority_rate']:.3f}")
    if nll is not None and levels["chance_nll"] > 0 and nll >= NEAR_CHANCE_NLL_FRACTION * levels["chance_nll"]:
        reasons.append(f"NLL {nll:.4f} is near {levels['chance_nll']:.4f}, that of predicting the class frequencies")
    return "; ".join(reasons) or None
