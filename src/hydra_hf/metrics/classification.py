"""Calibration, OOD-detection, selective-classification and ensemble-uncertainty metrics.

Pure functions on ``torch.Tensor`` or ``numpy.ndarray`` inputs. Scalar metrics return python
``float``; per-sample quantities (uncertainties, OOD scores) return a ``torch.Tensor`` on the
input's device, in the input's floating dtype promoted to at least ``float32``.

Conventions used throughout:

- ``probs (N, C)``: one probability vector per sample (rows sum to 1 within ``PROB_ATOL``).
- ``member_probs (N, M, C)``: the ``M`` ensemble members' probability vectors; the ensemble
  prediction is their mean over ``M`` (as in Hydra Ensembles).
- ``labels (N,)``: integer class indices in ``[0, C)``.
- OOD scores are per sample and **higher means more in-distribution** (e.g. the maximum softmax
  probability). In-distribution (ID) samples are the positive class unless stated otherwise.
- Entropies are in nats (natural logarithm).

Scalar metrics are computed in float64 on the CPU, so results do not depend on the input dtype's
accumulation order beyond the input's own rounding. The module imports no plotting library; see
:mod:`hydra_hf.evaluation.plots` for figures and :mod:`hydra_hf.evaluation.report` for tables.

The ``evaluate`` wrappers shipped in ``hydra_hf/metrics/metric_modules/<name>/<name>.py`` call these
functions, so ``evaluate.load(module_path("ece")).compute(...)`` gives the same numbers as
:func:`ece`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Literal

import numpy as np
import torch

from ..lazy import lazy_module
from ..modeling.hydra_formulas import ensemble_mutual_information, entropy

# heavy (scipy.stats: 1-3 s; transformers imports only scipy.optimize): imported on first use, for the t-test over
# seeds, so that `import hydra_hf` stays light (hydra_hf/lazy.py)
stats = lazy_module("scipy.stats")

__all__ = [
    "PROB_ATOL",
    "ArrayLike",
    "as_member_probs",
    "METRIC_MODULE_NAMES",
    "accuracy",
    "brier_score",
    "nll",
    "calibration_bins",
    "confidence_bins",
    "ece",
    "ece_from_confidence",
    "adaptive_ece",
    "ood_auroc",
    "fpr_at_95_tpr",
    "aupr_in",
    "aupr_out",
    "aurc",
    "eaurc",
    "predictive_entropy",
    "expected_entropy",
    "mutual_information",
    "disagreement",
    "pairwise_disagreement",
    "msp",
    "negative_entropy",
    "negative_mutual_information",
    "energy_score",
    "paired_bootstrap",
    "bootstrap_verdict",
    "calibration_report",
    "ood_report",
    "module_path",
]

ArrayLike = torch.Tensor | np.ndarray

PROB_ATOL = 1e-3
"""Tolerance on ``|sum_c p_c - 1|`` (and on values below 0 / above 1) for probability inputs.

Loose enough for float32/float16 softmaxes over ~1000 classes, tight enough to catch logits or
unnormalised scores passed by mistake."""

METRIC_MODULE_NAMES: tuple[str, ...] = (
    "adaptive_ece",
    "aupr",
    "aurc",
    "brier_score",
    "ece",
    "fpr95",
    "mutual_information",
    "nll",
    "ood_auroc",
)
"""Names accepted by :func:`module_path` (the ``evaluate`` modules shipped with the package)."""

# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    """Return ``x`` as a tensor (numpy arrays are wrapped without a copy where possible)."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"{name} is a numpy array of dtype object; pass a numeric array")
        return torch.from_numpy(np.ascontiguousarray(x))
    raise TypeError(
        f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}; "
        f"wrap it with torch.as_tensor(...) or np.asarray(...)"
    )


def _float_tensor(x: Any, name: str, ndim: int, shape_doc: str) -> torch.Tensor:
    """Validate a non-empty, finite, floating tensor with ``ndim`` dimensions."""
    t = _as_tensor(x, name)
    if t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.float64)
    if t.ndim != ndim:
        raise ValueError(f"{name} must have shape {shape_doc}, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); pass at least one sample")
    if not bool(torch.isfinite(t).all()):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {n_bad} NaN/inf value(s); remove or fix them before computing metrics")
    return t


def _check_simplex(t: torch.Tensor, name: str) -> None:
    """Raise if the last dimension of ``t`` is not a probability vector (within PROB_ATOL)."""
    lo, hi = float(t.min()), float(t.max())
    if lo < -PROB_ATOL or hi > 1 + PROB_ATOL:
        raise ValueError(
            f"{name} must hold probabilities in [0, 1], got values in [{lo:.4g}, {hi:.4g}]; "
            f"apply softmax to logits first"
        )
    sums = t.to(torch.float64).sum(dim=-1)
    worst = float((sums - 1).abs().max())
    if worst > PROB_ATOL:
        raise ValueError(
            f"{name} rows must sum to 1 (tolerance {PROB_ATOL}), but a row sums to "
            f"{float(sums.flatten()[(sums - 1).abs().flatten().argmax()]):.6g}; apply softmax to logits first"
        )


def _probs(x: Any, name: str = "probs") -> torch.Tensor:
    t = _float_tensor(x, name, 2, "(N, C)")
    _check_simplex(t, name)
    return t


def as_member_probs(x: Any, name: str = "member_probs") -> torch.Tensor:
    """``member_probs (N, M, C)`` as a float tensor, checked (rows on the simplex within :data:`PROB_ATOL`)."""
    t = _float_tensor(x, name, 3, "(N, M, C)")
    _check_simplex(t, name)
    return t


def _labels(x: Any, n: int, num_classes: int, name: str = "labels") -> torch.Tensor:
    t = _as_tensor(x, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer class-index array, got dtype {t.dtype}; use labels.long()")
    if t.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty; pass at least one sample")
    if t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} entries but the predictions have N={n} rows; they must match")
    t = t.to(torch.int64)
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(
            f"{name} must be class indices in [0, {num_classes}) for C={num_classes} classes, "
            f"got values in [{lo}, {hi}]"
        )
    return t


def _scores(x: Any, name: str) -> torch.Tensor:
    """Validate a non-empty 1-D score vector and return it as CPU float64."""
    return _float_tensor(x, name, 1, "(N,)").to("cpu", torch.float64)


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def _check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int):
        raise TypeError(f"n_bins must be an int, got {type(n_bins).__name__}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")


# ----------------------------------------------------------------------------------------------
# classification and calibration
# ----------------------------------------------------------------------------------------------


def accuracy(probs: ArrayLike, labels: ArrayLike) -> float:
    """Top-1 accuracy of ``argmax(probs)`` (first index wins ties).

    Shape:
        probs: (N, C); labels: (N,) integer class indices.
    """
    p = _probs(probs)
    y = _labels(labels, p.shape[0], p.shape[1]).to(p.device)
    return float((p.argmax(dim=1) == y).to(torch.float64).mean())


def brier_score(probs: ArrayLike, labels: ArrayLike) -> float:
    """Multi-class Brier score: ``mean_n sum_c (p_nc - 1[c = y_n])^2``.

    This is the original (Brier, 1950) multi-class convention, in ``[0, 2]``; it is *not* divided
    by the number of classes ``C`` (divide by ``C`` yourself to compare with libraries that do).

    Shape:
        probs: (N, C); labels: (N,).
    """
    p = _probs(probs).to("cpu", torch.float64)
    y = _labels(labels, p.shape[0], p.shape[1]).cpu()
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(torch.float64)  # (N, C)
    return float(((p - onehot) ** 2).sum(dim=1).mean())


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``-mean_n log p_n[y_n]`` in nats.

    Probabilities are clamped to ``[eps, 1]`` before the log, so a confident wrong prediction costs
    at most ``-log(eps)`` (27.6 nats for the default) instead of ``inf``.

    Shape:
        probs: (N, C); labels: (N,).
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    p = _probs(probs).to("cpu", torch.float64)
    y = _labels(labels, p.shape[0], p.shape[1]).cpu()
    p_true = p.gather(1, y[:, None]).squeeze(1).clamp(min=eps, max=1.0)  # (N,)
    return float(-torch.log(p_true).mean())


def calibration_bins(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int = 15,
    strategy: Literal["uniform", "quantile"] = "uniform",
) -> dict[str, torch.Tensor]:
    """Per-bin top-label confidence, accuracy and count (the data of a reliability diagram).

    The confidence of a sample is ``max_c p_c`` and it is correct when ``argmax_c p_c`` equals
    its label.

    - ``strategy="uniform"``: ``n_bins`` equal-width bins over ``[0, 1]``; a sample with confidence
      ``c`` falls in bin ``b`` when ``lower_b < c <= upper_b`` (Guo et al., 2017).
    - ``strategy="quantile"``: equal-mass bins. Samples are sorted by confidence (stable sort)
      and split into ``n_bins`` consecutive groups whose sizes differ by at most one (as
      ``numpy.array_split``); when ``N < n_bins`` only ``N`` bins are non-empty. ``lower``/``upper``
      are then the smallest/largest confidence in each bin.

    Empty bins have ``count = 0`` and NaN confidence, accuracy, lower and upper (for "quantile").

    Shape:
        probs: (N, C); labels: (N,).

    Returns:
        dict with float64 CPU tensors of shape ``(n_bins,)``: ``"lower"``, ``"upper"``,
        ``"confidence"`` (mean confidence in the bin), ``"accuracy"`` (fraction correct) and
        ``"count"`` (int64, number of samples).
    """
    _check_n_bins(n_bins)
    p = _probs(probs).to("cpu", torch.float64)
    y = _labels(labels, p.shape[0], p.shape[1]).cpu()
    conf, pred = p.max(dim=1)  # (N,), (N,)
    return confidence_bins(conf, pred == y, n_bins, strategy)


def confidence_bins(
    confidence: ArrayLike,
    correct: ArrayLike,
    n_bins: int = 15,
    strategy: Literal["uniform", "quantile"] = "uniform",
) -> dict[str, torch.Tensor]:
    """:func:`calibration_bins` from each sample's top-label confidence and correctness.

    For predictions whose probability vectors are too large to hold for a whole data set (a language
    model's next-token distributions over a vocabulary of 32k-150k tokens): keep ``max_c p_c`` and
    ``argmax_c p_c == label`` per sample and bin those. Same bins, same output as
    :func:`calibration_bins` (which calls it).

    Shape:
        confidence: (N,) floats in [0, 1]; correct: (N,) bool (or 0/1).
    """
    _check_n_bins(n_bins)
    conf = _scores(confidence, "confidence")
    lo, hi = float(conf.min()), float(conf.max())
    if lo < -PROB_ATOL or hi > 1 + PROB_ATOL:
        raise ValueError(
            f"confidence must be probabilities in [0, 1], got values in [{lo:.4g}, {hi:.4g}]; pass max softmax "
            "probabilities"
        )
    ok = _as_tensor(correct, "correct")
    if ok.shape != conf.shape:
        raise ValueError(
            f"correct has shape {tuple(ok.shape)} but confidence has shape {tuple(conf.shape)}; pass one flag per "
            "sample"
        )
    correct = ok.to("cpu", torch.float64)  # (N,)
    n = conf.shape[0]
    if strategy == "uniform":
        edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64)  # (n_bins + 1,)
        # right=False: index b with edges[b] < c <= edges[b + 1] (confidence 0 goes to bin 0)
        bin_idx = torch.bucketize(conf.clamp(0.0, 1.0), edges[1:-1], right=False)  # (N,)
        lower, upper = edges[:-1].clone(), edges[1:].clone()
    elif strategy == "quantile":
        order = torch.sort(conf, stable=True).indices  # (N,)
        bin_idx = torch.empty(n, dtype=torch.int64)
        sizes = [n // n_bins + (1 if b < n % n_bins else 0) for b in range(n_bins)]
        bin_idx[order] = torch.repeat_interleave(torch.arange(n_bins), torch.tensor(sizes))
        lower = torch.full((n_bins,), float("nan"), dtype=torch.float64)
        upper = torch.full((n_bins,), float("nan"), dtype=torch.float64)
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    count = torch.bincount(bin_idx, minlength=n_bins)  # (n_bins,)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, correct)
    denom = count.to(torch.float64)
    nan = torch.full_like(denom, float("nan"))
    confidence = torch.where(count > 0, conf_sum / denom.clamp(min=1), nan)
    acc = torch.where(count > 0, acc_sum / denom.clamp(min=1), nan)
    if strategy == "quantile":
        for b in range(n_bins):
            if count[b] > 0:
                in_bin = conf[bin_idx == b]
                lower[b], upper[b] = in_bin.min(), in_bin.max()
    return {"lower": lower, "upper": upper, "confidence": confidence, "accuracy": acc, "count": count}


def _ece_from_bins(bins: dict[str, torch.Tensor]) -> float:
    count = bins["count"]
    mask = count > 0
    weights = count[mask].to(torch.float64) / count.sum()
    gaps = (bins["accuracy"][mask] - bins["confidence"][mask]).abs()
    return float((weights * gaps).sum())


def ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """Expected calibration error, top-label, with ``n_bins`` equal-width bins.

    ``ECE = sum_b (n_b / N) |acc_b - conf_b|`` over the non-empty bins of
    :func:`calibration_bins` with ``strategy="uniform"`` (bins are ``(lower, upper]``).

    Shape:
        probs: (N, C); labels: (N,).
    """
    return _ece_from_bins(calibration_bins(probs, labels, n_bins, "uniform"))


def ece_from_confidence(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 15) -> float:
    """:func:`ece` from each sample's top-label confidence and correctness (:func:`confidence_bins`).

    Equals ``ece(probs, labels, n_bins)`` for ``confidence = probs.max(1)`` and
    ``correct = probs.argmax(1) == labels``.

    Shape:
        confidence: (N,); correct: (N,) bool.
    """
    return _ece_from_bins(confidence_bins(confidence, correct, n_bins, "uniform"))


def adaptive_ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> float:
    """Adaptive (equal-mass) ECE: the ECE formula over :func:`calibration_bins` with
    ``strategy="quantile"``, i.e. ``n_bins`` bins holding (nearly) the same number of samples.

    Shape:
        probs: (N, C); labels: (N,).
    """
    return _ece_from_bins(calibration_bins(probs, labels, n_bins, "quantile"))


# ----------------------------------------------------------------------------------------------
# OOD detection: scores are "higher = more in-distribution"
# ----------------------------------------------------------------------------------------------


def _two_sided(scores_id: ArrayLike, scores_ood: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate an ID/OOD score pair; each side must be non-empty (two classes are needed)."""
    for name, x in (("scores_id", scores_id), ("scores_ood", scores_ood)):
        t = _as_tensor(x, name)
        if t.numel() == 0:
            raise ValueError(
                f"{name} is empty, so there is one class only; OOD metrics need "
                f"at least one ID and one OOD sample"
            )
    return _scores(scores_id, "scores_id"), _scores(scores_ood, "scores_ood")


def ood_auroc(scores_id: ArrayLike, scores_ood: ArrayLike) -> float:
    """Area under the ROC curve for separating ID (positive class) from OOD samples.

    Scores must be "higher = more in-distribution" (e.g. :func:`msp`). Computed as the
    Mann-Whitney statistic ``P(s_id > s_ood) + 0.5 P(s_id = s_ood)``, which equals
    ``sklearn.metrics.roc_auc_score(y, s)`` with ``y = 1`` for ID, ties included.

    Shape:
        scores_id: (N_id,); scores_ood: (N_ood,). Both must be non-empty.
    """
    s_id, s_ood = _two_sided(scores_id, scores_ood)
    ood_sorted = torch.sort(s_ood).values
    below = torch.searchsorted(ood_sorted, s_id, right=False).to(torch.float64)  # OOD < s, (N_id,)
    below_or_equal = torch.searchsorted(ood_sorted, s_id, right=True).to(torch.float64)  # OOD <= s
    u = (below + 0.5 * (below_or_equal - below)).sum()
    return float(u / (s_id.numel() * s_ood.numel()))


def fpr_at_95_tpr(scores_id: ArrayLike, scores_ood: ArrayLike, tpr: float = 0.95) -> float:
    """False-positive rate at 95 % true-positive rate (FPR95).

    A sample is accepted as ID when its score is ``>= t``. ``t`` is the largest threshold that
    accepts at least a fraction ``tpr`` of the ID samples (ties at ``t`` are all accepted); FPR95 is
    the fraction of OOD samples accepted at ``t``. This equals ``fpr[argmax(tpr_curve >= 0.95)]`` on
    ``sklearn.metrics.roc_curve(y, s, drop_intermediate=False)`` with ``y = 1`` for ID. Lower is
    better.

    Shape:
        scores_id: (N_id,); scores_ood: (N_ood,). Both must be non-empty.
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    s_id, s_ood = _two_sided(scores_id, scores_ood)
    n_id = s_id.numel()
    # smallest k with k / n_id >= tpr, compared exactly as sklearn's tpr array is
    k = max(1, min(n_id, math.ceil(tpr * n_id)))
    while k < n_id and k / n_id < tpr:
        k += 1
    while k > 1 and (k - 1) / n_id >= tpr:
        k -= 1
    threshold = torch.sort(s_id, descending=True).values[k - 1]  # k-th largest ID score
    return float((s_ood >= threshold).to(torch.float64).mean())


def _average_precision(pos: torch.Tensor, neg: torch.Tensor) -> float:
    """Average precision with ``pos`` as the positive class, higher score = more positive.

    ``AP = sum_k (R_k - R_{k-1}) P_k`` over the distinct thresholds in decreasing order (no
    interpolation), exactly as ``sklearn.metrics.average_precision_score``.
    """
    scores = torch.cat([pos, neg])  # (N,)
    is_pos = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])  # (N,)
    order = torch.sort(scores, descending=True, stable=True).indices
    scores, is_pos = scores[order], is_pos[order]
    # last index of each group of tied scores
    last = torch.nonzero(torch.diff(scores) != 0).flatten()
    last = torch.cat([last, torch.tensor([scores.numel() - 1])])
    tps = torch.cumsum(is_pos, 0)[last]  # (K,)
    fps = (last + 1).to(torch.float64) - tps  # (K,)
    precision = tps / (tps + fps)
    recall = tps / pos.numel()
    d_recall = torch.diff(recall, prepend=torch.zeros(1, dtype=torch.float64))
    return float((d_recall * precision).sum())


def aupr_in(scores_id: ArrayLike, scores_ood: ArrayLike) -> float:
    """Area under the precision-recall curve with ID as the positive class (AUPR-In).

    Scores are "higher = more in-distribution". Average precision as in
    ``sklearn.metrics.average_precision_score(y, s)`` with ``y = 1`` for ID.

    Shape:
        scores_id: (N_id,); scores_ood: (N_ood,). Both must be non-empty.
    """
    s_id, s_ood = _two_sided(scores_id, scores_ood)
    return _average_precision(s_id, s_ood)


def aupr_out(scores_id: ArrayLike, scores_ood: ArrayLike) -> float:
    """Area under the precision-recall curve with OOD as the positive class (AUPR-Out).

    The scores are negated so that higher means more OOD: equals
    ``sklearn.metrics.average_precision_score(y, -s)`` with ``y = 1`` for OOD.

    Shape:
        scores_id: (N_id,); scores_ood: (N_ood,). Both must be non-empty.
    """
    s_id, s_ood = _two_sided(scores_id, scores_ood)
    return _average_precision(-s_ood, -s_id)


# ----------------------------------------------------------------------------------------------
# selective classification
# ----------------------------------------------------------------------------------------------


def _risk_curve_area(conf: torch.Tensor, errors: torch.Tensor) -> float:
    """``(1/N) sum_{k=1..N} risk(k)``, risk(k) = errors among the k most confident / k.

    Within a group of tied confidences the errors are spread evenly (the expected value over
    random tie-breaking), so the result does not depend on the order of tied samples.
    """
    n = conf.numel()
    order = torch.sort(conf, descending=True, stable=True).indices
    conf, errors = conf[order], errors[order]
    new_group = torch.cat([torch.tensor([False]), torch.diff(conf) != 0])  # (N,)
    group_id = torch.cumsum(new_group.to(torch.int64), 0)  # (N,)
    group_errors = torch.zeros(int(group_id[-1]) + 1, dtype=torch.float64).index_add_(0, group_id, errors)
    group_size = torch.bincount(group_id).to(torch.float64)  # (G,)
    spread = (group_errors / group_size)[group_id]  # (N,) expected error of each ranked slot
    k = torch.arange(1, n + 1, dtype=torch.float64)
    risk = torch.cumsum(spread, 0) / k  # (N,)
    return float(risk.mean())


def _selective_inputs(
    probs: ArrayLike, labels: ArrayLike, confidence: ArrayLike | None
) -> tuple[torch.Tensor, torch.Tensor]:
    p = _probs(probs).to("cpu", torch.float64)
    y = _labels(labels, p.shape[0], p.shape[1]).cpu()
    errors = (p.argmax(dim=1) != y).to(torch.float64)  # (N,)
    if confidence is None:
        conf = p.max(dim=1).values
    else:
        conf = _scores(confidence, "confidence")
        if conf.shape[0] != p.shape[0]:
            raise ValueError(f"confidence has {conf.shape[0]} entries but probs has N={p.shape[0]} rows")
    return conf, errors


def aurc(probs: ArrayLike, labels: ArrayLike, confidence: ArrayLike | None = None) -> float:
    """Area under the risk-coverage curve (AURC) of selective classification; lower is better.

    Samples are ranked by ``confidence`` (default: the maximum softmax probability of ``probs``);
    at coverage ``k/N`` the selective risk is the error rate of ``argmax(probs)`` among the ``k``
    most confident samples, and ``AURC = (1/N) sum_{k=1..N} risk(k/N)`` (Geifman et al., 2019).
    Tied confidences share their errors evenly, so the result is order-independent.

    Shape:
        probs: (N, C); labels: (N,); confidence: (N,) or None.
    """
    conf, errors = _selective_inputs(probs, labels, confidence)
    return _risk_curve_area(conf, errors)


def eaurc(probs: ArrayLike, labels: ArrayLike, confidence: ArrayLike | None = None) -> float:
    """Excess AURC: :func:`aurc` minus the AURC of an oracle ranking (all errors ranked last).

    The oracle term is computed exactly on the same ``N`` samples (not with the continuous
    approximation ``r + (1 - r) log(1 - r)``), so a perfect ranking gives exactly 0.

    Shape:
        probs: (N, C); labels: (N,); confidence: (N,) or None.
    """
    conf, errors = _selective_inputs(probs, labels, confidence)
    oracle_conf = -errors  # correct samples (0) rank above errors (-1)
    return _risk_curve_area(conf, errors) - _risk_curve_area(oracle_conf, errors)


# ----------------------------------------------------------------------------------------------
# ensemble uncertainty, per sample
# ----------------------------------------------------------------------------------------------


def predictive_entropy(member_probs: ArrayLike) -> torch.Tensor:
    """Total uncertainty: entropy (nats) of the ensemble-mean probabilities.

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mp = as_member_probs(member_probs)
    mp = mp.to(_out_dtype(mp))
    return entropy(mp.mean(dim=1))


def expected_entropy(member_probs: ArrayLike) -> torch.Tensor:
    """Aleatoric uncertainty: mean over members of each member's entropy (nats).

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mp = as_member_probs(member_probs)
    mp = mp.to(_out_dtype(mp))
    return entropy(mp).mean(dim=1)


def mutual_information(member_probs: ArrayLike) -> torch.Tensor:
    """Epistemic uncertainty: ``predictive_entropy - expected_entropy`` (nats), clamped at 0.

    Zero when all members give the same distribution, positive when they disagree.

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mp = as_member_probs(member_probs)
    mp = mp.to(_out_dtype(mp))
    return ensemble_mutual_information(mp)


def disagreement(member_probs: ArrayLike) -> torch.Tensor:
    """Fraction of members whose top-1 class differs from the ensemble's top-1 class.

    The ensemble's class is ``argmax`` of the mean probabilities. Values in ``[0, 1 - 1/M]``.
    Average over samples for a dataset-level number. See also :func:`pairwise_disagreement`.

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mp = as_member_probs(member_probs)
    ens_pred = mp.mean(dim=1).argmax(dim=-1)  # (N,)
    member_pred = mp.argmax(dim=-1)  # (N, M)
    return (member_pred != ens_pred[:, None]).to(_out_dtype(mp)).mean(dim=1)


def pairwise_disagreement(member_probs: ArrayLike) -> torch.Tensor:
    """Fraction of member pairs ``m < m'`` whose top-1 classes differ (needs ``M >= 2``).

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    mp = as_member_probs(member_probs)
    m = mp.shape[1]
    if m < 2:
        raise ValueError(f"pairwise_disagreement needs at least 2 members, got M={m}")
    pred = mp.argmax(dim=-1)  # (N, M)
    differ = pred[:, :, None] != pred[:, None, :]  # (N, M, M)
    n_pairs = m * (m - 1) / 2
    return differ.to(_out_dtype(mp)).sum(dim=(1, 2)) / 2 / n_pairs


# ----------------------------------------------------------------------------------------------
# OOD scores, per sample, higher = more in-distribution
# ----------------------------------------------------------------------------------------------


def msp(probs: ArrayLike) -> torch.Tensor:
    """Maximum softmax probability ``max_c p_c`` (higher = more ID).

    Shape:
        probs: (N, C) -> (N,)
    """
    p = _probs(probs)
    return p.to(_out_dtype(p)).max(dim=1).values


def negative_entropy(probs: ArrayLike) -> torch.Tensor:
    """Negative predictive entropy ``sum_c p_c log p_c`` in nats (higher = more ID).

    Shape:
        probs: (N, C) -> (N,)
    """
    p = _probs(probs)
    return -entropy(p.to(_out_dtype(p)))


def negative_mutual_information(member_probs: ArrayLike) -> torch.Tensor:
    """Negative ensemble mutual information (higher = members agree = more ID).

    Shape:
        member_probs: (N, M, C) -> (N,)
    """
    return -mutual_information(member_probs)


def energy_score(logits: ArrayLike, temperature: float = 1.0) -> torch.Tensor:
    """Negative free energy ``T * logsumexp(logits / T)`` (Liu et al., 2020; higher = more ID).

    For a Hydra ensemble pass the ensemble ``logits`` (log of the mean softmax) or a member's
    logits.

    Shape:
        logits: (N, C) -> (N,)
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = _float_tensor(logits, "logits", 2, "(N, C)")
    z = z.to(_out_dtype(z))
    return temperature * torch.logsumexp(z / temperature, dim=1)


# ----------------------------------------------------------------------------------------------
# reports
# ----------------------------------------------------------------------------------------------


def calibration_report(
    probs: ArrayLike,
    labels: ArrayLike,
    member_probs: ArrayLike | None = None,
    n_bins: int = 15,
) -> dict[str, float]:
    """All in-distribution numbers of one model, as python floats.

    Keys: ``accuracy``, ``brier``, ``nll``, ``ece``, ``aece``, ``aurc``, ``eaurc``; with
    ``member_probs`` also the dataset means of ``predictive_entropy``, ``expected_entropy``,
    ``mutual_information``, ``disagreement`` and (for ``M >= 2``) ``pairwise_disagreement``.

    Shape:
        probs: (N, C) (the ensemble prediction); labels: (N,); member_probs: (N, M, C) or None.
    """
    p = _probs(probs)
    report = {
        "accuracy": accuracy(p, labels),
        "brier": brier_score(p, labels),
        "nll": nll(p, labels),
        "ece": ece(p, labels, n_bins),
        "aece": adaptive_ece(p, labels, n_bins),
        "aurc": aurc(p, labels),
        "eaurc": eaurc(p, labels),
    }
    if member_probs is not None:
        mp = as_member_probs(member_probs)
        if mp.shape[0] != p.shape[0] or mp.shape[2] != p.shape[1]:
            raise ValueError(
                f"member_probs has shape {tuple(mp.shape)} but probs has shape {tuple(p.shape)}; "
                f"expected (N, M, C) = ({p.shape[0]}, M, {p.shape[1]})"
            )
        report["predictive_entropy"] = float(predictive_entropy(mp).double().mean())
        report["expected_entropy"] = float(expected_entropy(mp).double().mean())
        report["mutual_information"] = float(mutual_information(mp).double().mean())
        report["disagreement"] = float(disagreement(mp).double().mean())
        if mp.shape[1] >= 2:
            report["pairwise_disagreement"] = float(pairwise_disagreement(mp).double().mean())
    return report


def ood_report(scores_id: ArrayLike, scores_ood: ArrayLike) -> dict[str, float]:
    """``auroc``, ``fpr95``, ``aupr_in`` and ``aupr_out`` for one ID/OOD pair, as python floats.

    Scores are "higher = more in-distribution" (see :func:`hydra_hf.metrics.ood_score`).

    Shape:
        scores_id: (N_id,); scores_ood: (N_ood,).
    """
    s_id, s_ood = _two_sided(scores_id, scores_ood)
    return {
        "auroc": ood_auroc(s_id, s_ood),
        "fpr95": fpr_at_95_tpr(s_id, s_ood),
        "aupr_in": aupr_in(s_id, s_ood),
        "aupr_out": aupr_out(s_id, s_ood),
    }


def paired_bootstrap(
    statistic: Any,
    sizes: tuple[int, ...],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, float]:
    """Paired bootstrap interval of a difference between two models evaluated on the same examples.

    ``statistic(*indices)`` returns the difference (model A's metric minus model B's) computed on
    the examples ``indices[g]`` of each group ``g`` (e.g. the ID set, and for an OOD metric the OOD
    set too); each group of ``sizes[g]`` examples is resampled with replacement, independently of
    the others, and both models always see the same resample (paired). The interval is the
    percentile interval of ``n_boot`` resamples.

    Returns:
        ``{"difference", "ci_low", "ci_high", "level", "n_boot"}``; ``difference`` is on all examples.
    """
    if n_boot < 10:
        raise ValueError(f"n_boot must be at least 10, got {n_boot}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if any(n < 1 for n in sizes):
        raise ValueError(f"every group needs examples, got sizes {sizes}")
    g = torch.Generator().manual_seed(seed)
    point = float(statistic(*[torch.arange(n) for n in sizes]))
    draws = torch.tensor(
        [float(statistic(*[torch.randint(0, n, (n,), generator=g) for n in sizes])) for _ in range(n_boot)],
        dtype=torch.float64,
    )
    draws = draws[torch.isfinite(draws)]
    alpha = (1 - level) / 2
    low, high = torch.quantile(draws, torch.tensor([alpha, 1 - alpha], dtype=torch.float64)).tolist()
    return {"difference": point, "ci_low": low, "ci_high": high, "level": level, "n_boot": int(n_boot)}


def bootstrap_verdict(interval: dict[str, float], higher_is_better: bool) -> str:
    """``"better"`` / ``"worse"`` for model A when the interval excludes 0, else ``"tie"``."""
    if interval["ci_low"] <= 0 <= interval["ci_high"]:
        return "tie"
    return "better" if (interval["difference"] > 0) == higher_is_better else "worse"


def paired_t_over_seeds(differences: Any, level: float = 0.05) -> dict[str, Any]:
    """Two-sided t-test of per-seed paired differences (model A minus model B on each seed) against 0.

    Returns ``{"p", "decided"}``: ``decided`` when ``p < level``. One seed decides nothing (``p = 1``); the same
    difference on every seed has no spread to test: decided when it is not 0.
    """
    values = [float(v) for v in differences]
    if len(values) < 2 or max(values) == min(values):
        p = 0.0 if len(values) >= 2 and values[0] != 0 else 1.0
    else:
        p = float(stats.ttest_1samp(values, 0.0).pvalue)
    return {"p": p, "decided": p < level}


def module_path(name: str) -> str:
    """Local path of a shipped ``evaluate`` metric module, for ``evaluate.load(module_path(name))``.

    Works offline: the modules live in ``hydra_hf/metrics/metric_modules/<name>/<name>.py`` and import
    :mod:`hydra_hf.metrics`. Names: :data:`METRIC_MODULE_NAMES`.
    """
    if name not in METRIC_MODULE_NAMES:
        raise ValueError(f"unknown metric module {name!r}; available: {list(METRIC_MODULE_NAMES)}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metric_modules", name)
    if not os.path.isfile(os.path.join(path, f"{name}.py")):
        raise FileNotFoundError(
            f"metric module {name!r} is missing from the installed package (looked in {path}); reinstall hydra_hf"
        )
    return path
