"""Selective prediction with a risk guarantee: Learn then Test (Angelopoulos, Bates, Candès, Jordan &
Lei, "Learn then Test: Calibrating Predictive Algorithms to Achieve Risk Control", 2021).

An input is answered when its uncertainty score ``u`` (``msp``: 1 - max p, ``entropy``, ``mi``) is at
most a threshold ``lambda``, and refused otherwise. For every threshold of a fixed grid, ordered from
the strictest, the null hypothesis "the error rate among answered inputs exceeds ``risk``" is tested
with the exact binomial p-value ``P(Binomial(n_lambda, risk) <= k_lambda)`` (``n_lambda`` answered,
``k_lambda`` of them wrong; the Clopper-Pearson bound inverted), conditional on the answered count.
Fixed-sequence testing rejects while ``p <= delta`` and stops at the first failure; the threshold kept
is the last rejected one. Then, with probability at least ``1 - delta`` over the calibration draw, the
error among answered inputs like the calibration data is at most ``risk``. Thresholds that answer
fewer than ``min_answered`` calibration inputs (default 30), or fewer than
``ceil(log delta / log(1 - risk))`` (which cannot be rejected even with no error), are skipped, as in
Angelopoulos & Bates (2021, "A Gentle Introduction to Conformal Prediction", selective
classification): the strictest thresholds answer too few inputs to test, and failing there would end
the sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import HydraInputError
from ..modeling.pipeline_hydra import SELECTIVE_SCORES, selective_uncertainty
from .conformal import check_alpha

__all__ = ["SELECTIVE_SCORES", "SelectiveFit", "binomial_p_value", "fit_selective", "threshold_grid"]

GRID_SIZE = 2000


def binomial_p_value(errors: int, answered: int, risk: float) -> float:
    """``P(Binomial(answered, risk) <= errors)``: small when so few errors are unlikely at ``risk``."""
    if answered == 0:
        return 1.0
    log_r, log_q = math.log(risk), math.log1p(-risk)
    base = math.lgamma(answered + 1)
    terms = [base - math.lgamma(i + 1) - math.lgamma(answered - i + 1) + i * log_r + (answered - i) * log_q
             for i in range(errors + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def threshold_grid(score: str, num_classes: int, size: int = GRID_SIZE) -> torch.Tensor:
    """The fixed candidate thresholds, strictest first: geometric from ``1e-8 * U`` up to ``U``, the
    score's largest value (``1 - 1/C`` for msp, ``log C`` for entropy and mi), then one above ``U``."""
    top = 1.0 - 1.0 / num_classes if score == "msp" else math.log(num_classes)
    grid = top * torch.logspace(-8, 0, size, dtype=torch.float64)
    return torch.cat([torch.zeros(1, dtype=torch.float64), grid, torch.tensor([top * 1.5 + 1.0], dtype=torch.float64)])


@dataclass(frozen=True)
class SelectiveFit:
    """The kept threshold and what it did on the calibration data."""

    score: str
    risk: float
    delta: float
    threshold: float
    answered_fraction: float  # coverage left on the calibration data
    calibration_error: float  # error among the answered calibration inputs
    p_value: float

    def to_dict(self) -> dict[str, object]:
        return {"score": self.score, "risk": self.risk, "delta": self.delta, "threshold": self.threshold,
                "answered_fraction": self.answered_fraction, "calibration_selective_error": self.calibration_error,
                "p_value": self.p_value, "selective_procedure": "learn-then-test, binomial p-value, fixed sequence"}


class UncertifiedRisk(HydraInputError):
    """No threshold certifies the risk on the calibration data. ``reason`` says why; the message adds ``fix``
    (the flags of ``hydra-hf calibrate``): a caller with other options reports ``reason`` with its own fix."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}; {fix}")
        self.reason = reason


def fit_selective(
    member_probs: torch.Tensor,
    labels: torch.Tensor,
    score: str = "msp",
    risk: float = 0.1,
    delta: float = 0.1,
    *,
    min_answered: int = 30,
) -> SelectiveFit:
    """The loosest grid threshold on ``score`` whose answered inputs' error is certified at most ``risk``
    with confidence ``1 - delta`` (Learn then Test; see the module docstring).

    Args:
        member_probs: ``(n, M, C)`` the members' calibration probabilities.
        labels: ``(n,)`` true classes.
    """
    if score not in SELECTIVE_SCORES:
        raise HydraInputError(f"selective score {score!r} is unknown; use one of {', '.join(SELECTIVE_SCORES)}")
    risk, delta = check_alpha(risk, "risk"), check_alpha(delta, "delta")
    n = int(labels.numel())
    uncertainty = selective_uncertainty(member_probs.double(), score)  # (n,)
    wrong = member_probs.double().mean(dim=1).argmax(dim=-1) != labels.long()  # (n,)
    order = uncertainty.argsort()
    sorted_u, sorted_wrong = uncertainty[order], wrong[order].long().cumsum(0)  # errors among the k surest
    grid = threshold_grid(score, member_probs.shape[-1])
    answered = torch.searchsorted(sorted_u, grid, right=True).tolist()  # (G,): inputs with u <= lambda
    thresholds = grid.tolist()

    def fixed_sequence(risk: float) -> tuple[tuple[float, int, int, float] | None, tuple[int, int, float] | None]:
        """(the last threshold rejected, the first test that failed: answered, errors, p-value)."""
        # fewer answers than this cannot reject even with no error (or are too few to test)
        least = max(math.ceil(math.log(delta) / math.log1p(-risk)), int(min_answered))
        kept = None
        for lam, k in zip(thresholds, answered):
            if k < least:
                continue
            errors = int(sorted_wrong[k - 1])
            p = binomial_p_value(errors, k, risk)
            if p > delta:
                return kept, (k, errors, p)
            kept = (lam, k, errors, p)
        return kept, None

    kept, failed = fixed_sequence(risk)
    if kept is None:
        least = max(math.ceil(math.log(delta) / math.log1p(-risk)), int(min_answered))
        if failed is None:  # no threshold answers enough inputs to be tested
            why = f"even answering all {n} examples gives fewer than the {least} answers a test needs"
        else:
            k, errors, p = failed
            why = (f"the strictest threshold with enough answers to test (the {k} surest; at least {least} are needed "
                   f"at this risk and delta) already makes {errors} error{'s' * (errors != 1)}, which at risk "
                   f"{risk:g} has p-value {p:.2f} > delta {delta:g}, and the test sequence stops at its first failure")
        looser = next((r for r in (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5) if r > risk and fixed_sequence(r)[0]), None)
        hint = (f"raise --risk ({looser:g} certifies on these examples)" if looser else
                "no --risk up to 0.5 certifies on these examples: check the labels, or raise --risk above 0.5")
        raise UncertifiedRisk(
            f"no threshold on {score} certifies an error rate <= {risk:g} among answered inputs with confidence "
            f"{1 - delta:g} on these {n} examples: {why}",
            f"{hint}; or give more calibration data (its surest answers are then surer), raise --delta, or pass "
            "--risk none for prediction sets only",
        )
    lam, k, errors, p = kept
    return SelectiveFit(score, risk, delta, float(lam), k / n, errors / k, p)
