"""Split conformal prediction sets with the finite-sample quantile (Vovk et al. 2005; Angelopoulos &
Bates, "A Gentle Introduction to Conformal Prediction", 2021).

Given n labelled calibration examples exchangeable with the test input, the non-conformity score of
every calibration example at its true label, and ``q_hat`` = the ``ceil((n + 1)(1 - alpha))``-th
smallest of them, the set ``{y : s(x, y) <= q_hat}`` holds the test label with probability at least
``1 - alpha`` (marginally, over calibration and test draws). Scores (in the shipped
``pipeline_hydra.conformal_scores``): ``lac`` ``1 - p_y`` (Sadinle et al. 2019), ``aps`` the mass of
the classes ranked at or above ``y`` (Romano et al. 2020), ``raps`` APS plus a rank penalty
(Angelopoulos et al. 2021). By default all are deterministic: no random tie-breaking, so APS / RAPS
coverage may exceed ``1 - alpha`` (with two classes, by far). ``randomized`` APS / RAPS subtract
``U * p_y`` from the score (Romano et al. 2020; Angelopoulos et al. 2021), with one uniform ``U`` per
input from ``pipeline_hydra.conformal_noise``: a hash of the seed and the input's rounded probabilities,
the same at fit time and wherever the folder is used. The scores are then (almost surely) distinct and
coverage is within ``[1 - alpha, 1 - alpha + 1 / (n + 1))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..errors import HydraInputError, HydraTypeError
from ..modeling.pipeline_hydra import CONFORMAL_METHODS, RANDOMIZED_METHODS, conformal_noise, conformal_scores

__all__ = ["CONFORMAL_METHODS", "ConformalFit", "check_alpha", "conformal_quantile", "fit_conformal",
           "min_calibration_size", "prediction_sets"]


# what a level in (0, 1) means, by its name (the examples of check_alpha's messages)
LEVEL_EXAMPLES = {
    "alpha": "e.g. 0.1: sets that hold the true label 90% of the time",
    "risk": "e.g. 0.05: at most 5% errors among answered inputs",
    "delta": "e.g. 0.1: the risk holds with 90% confidence",
}


def check_alpha(alpha: float, name: str = "alpha") -> float:
    """``alpha`` as a float in (0, 1), or one line naming the bad value (``name``: ``alpha``, ``risk`` or
    ``delta``, or the flag that gave it, ``--risk``) and an example of that level."""
    example = LEVEL_EXAMPLES.get(name.lstrip("-").split("-")[-1], LEVEL_EXAMPLES["alpha"])
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise HydraTypeError(f"{name} must be a number in (0, 1), got {alpha!r}; {example}")
    if not 0 < alpha < 1 or not math.isfinite(alpha):
        raise HydraInputError(f"{name} {alpha!r} is outside (0, 1); {example}")
    return float(alpha)


def min_calibration_size(alpha: float) -> int:
    """The smallest n for which the finite-sample quantile exists: ``ceil((n + 1)(1 - alpha)) <= n``,
    that is ``n >= ceil(1 / alpha) - 1``."""
    n = max(math.ceil(1.0 / check_alpha(alpha) - 1e-12) - 1, 1)
    while math.ceil((n + 1) * (1 - alpha) - 1e-12) > n:  # guard the float rounding of 1 / alpha
        n += 1
    return n


def conformal_quantile(scores: torch.Tensor, alpha: float) -> float:
    """``q_hat``: the ``ceil((n + 1)(1 - alpha))``-th smallest of the calibration ``scores`` ``(n,)``."""
    alpha = check_alpha(alpha)
    n = int(scores.numel())
    need = min_calibration_size(alpha)
    if n < need:
        raise HydraInputError(
            f"alpha={alpha:g} needs at least {need} labelled calibration examples (n >= ceil(1/alpha) - 1), got {n}; "
            "give more calibration data or a larger alpha"
        )
    rank = math.ceil((n + 1) * (1 - alpha) - 1e-12)  # 1-based; the epsilon keeps e.g. 100 * 0.9 at 90
    return float(scores.double().reshape(-1).sort().values[rank - 1])


@dataclass(frozen=True)
class ConformalFit:
    """A fitted split-conformal predictor (what ``config.calibration`` stores of it)."""

    method: str
    alpha: float
    q_hat: float
    n: int
    penalty: float = 0.0
    regularization_rank: int = 1
    randomized: bool = False
    seed: int | None = None  # the seed of the randomised scores' U (None: deterministic)

    def to_dict(self) -> dict[str, object]:
        return {"method": self.method, "alpha": self.alpha, "q_hat": self.q_hat, "n": self.n,
                "randomized": self.randomized, "seed": self.seed, "penalty": self.penalty,
                "regularization_rank": self.regularization_rank}

    def noise(self, probs: torch.Tensor) -> torch.Tensor | None:
        """``(N,)`` the randomised scores' U of ``probs`` ``(N, C)``, or None when deterministic."""
        return conformal_noise(probs, self.seed) if self.randomized else None


def fit_conformal(
    probs: torch.Tensor,
    labels: torch.Tensor,
    alpha: float = 0.1,
    method: str = "lac",
    *,
    penalty: float = 0.1,
    regularization_rank: int = 1,
    randomized: bool = False,
    seed: int = 0,
) -> ConformalFit:
    """Fit ``q_hat`` on calibration probabilities.

    Args:
        probs: ``(n, C)`` class probabilities (the ensemble's, see ``calibrated_member_probs``).
        labels: ``(n,)`` true classes.
        alpha: miscoverage level in (0, 1): the sets hold the label with probability >= 1 - alpha.
        method: ``lac``, ``aps`` or ``raps``.
        penalty, regularization_rank: RAPS' lambda and k_reg (ignored by the other methods).
        randomized: APS / RAPS with a uniform U per input (see the module docstring); ``seed`` keys U.
    """
    alpha = check_alpha(alpha)
    if method not in CONFORMAL_METHODS:
        raise HydraInputError(f"conformal method {method!r} is unknown; use one of {', '.join(CONFORMAL_METHODS)}")
    if randomized and method not in RANDOMIZED_METHODS:
        raise HydraInputError(f"--randomized applies to {' and '.join(RANDOMIZED_METHODS)}, not {method} (its score "
                              "1 - p_y needs no tie-breaking); drop --randomized or pick --method aps")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise HydraTypeError(f"seed must be an integer, got {seed!r}")
    if method == "raps":
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0 <= penalty < math.inf:
            raise HydraInputError(f"RAPS penalty must be a finite number >= 0, got {penalty!r}; e.g. 0.1")
        if (
            isinstance(regularization_rank, bool)
            or not isinstance(regularization_rank, int)
            or regularization_rank < 1
        ):
            raise HydraInputError(f"RAPS regularization rank must be an integer >= 1, got {regularization_rank!r}")
    else:
        penalty, regularization_rank = 0.0, 1
    if probs.dim() != 2 or labels.shape != probs.shape[:1]:
        raise HydraInputError(
            f"probs must be (n, C) and labels (n,), got {tuple(probs.shape)} and {tuple(labels.shape)}"
        )
    fit = ConformalFit(method, alpha, 0.0, int(labels.numel()), float(penalty), int(regularization_rank),
                       bool(randomized), int(seed) if randomized else None)
    scores = conformal_scores(probs.double(), method, fit.penalty, fit.regularization_rank, fit.noise(probs))  # (n, C)
    true_scores = scores.gather(1, labels.long()[:, None]).squeeze(1)  # (n,)
    return replace(fit, q_hat=conformal_quantile(true_scores, alpha))


def prediction_sets(probs: torch.Tensor, fit: ConformalFit) -> torch.Tensor:
    """``(N, C)`` bool: class ``c`` is in input ``i``'s set. ``probs``: ``(N, C)``."""
    scores = conformal_scores(probs.double(), fit.method, fit.penalty, fit.regularization_rank, fit.noise(probs))
    return scores <= fit.q_hat
