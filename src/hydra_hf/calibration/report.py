"""How well calibrated decisions do on test data, for ``hydra-hf evaluate``: the empirical coverage and
mean size of the conformal sets, the selective accuracy and answered share at the abstention threshold,
the AURC and risk-coverage curve of the abstention score, and the share of each OOD set refused or given
a set of more than one label -- for every evaluated model, each with its own calibration."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .. import metrics
from ..evaluation.plots import risk_coverage_diagram
from ..modeling.pipeline_hydra import calibrated_decisions, calibrated_member_probs
from .fit import fit_calibration
from .selective import UncertifiedRisk

__all__ = ["DEFAULTS", "decision_metrics", "fit_for_report", "render_decisions", "risk_coverage_figure"]

logger = logging.getLogger(__name__)

# the settings of a model without a stored calibration (those of `hydra-hf calibrate`'s defaults)
DEFAULTS = {"method": "lac", "score": "msp", "risk": 0.1, "delta": 0.1, "randomized": False, "seed": 0}


def fit_for_report(member_logits: torch.Tensor, labels: torch.Tensor, alpha: float, settings: Mapping[str, Any],
                   temperature: float | None = None) -> dict[str, Any]:
    """A calibration fitted on validation outputs with ``settings`` (method, score, risk, delta,
    randomized, seed; the model's own probabilities, or divided by ``temperature``). A threshold that
    cannot be certified leaves ``threshold`` None and the reason in ``selective_error``."""
    kwargs = dict(
        alpha=alpha,
        method=settings["method"],
        score=settings["score"],
        temperature=temperature,
        penalty=float(settings.get("penalty", 0.1)),
        regularization_rank=int(settings.get("regularization_rank", 1)),
        randomized=bool(settings.get("randomized", False)),
        seed=int(settings.get("seed", 0)),
    )
    try:
        return fit_calibration(member_logits, labels, risk=settings["risk"], delta=settings["delta"], **kwargs)
    except UncertifiedRisk as exc:  # the report says why, with what this fit's risk and delta come from
        record = fit_calibration(member_logits, labels, risk=None, **kwargs)
        record.update(risk=settings["risk"], delta=settings["delta"],
                      selective_error=f"{exc.reason}: no abstention at this risk and delta (the stored calibration's, "
                      "else hydra-hf calibrate's defaults); more validation data may certify it")
        return record


def _interval(statistic: Any, n: int, n_boot: int, seed: int) -> dict[str, float] | None:
    if not n_boot or n < 1:
        return None
    out = metrics.paired_bootstrap(statistic, (n,), n_boot=n_boot, seed=seed)
    return {"ci_low": out["ci_low"], "ci_high": out["ci_high"], "level": out["level"]}


def decision_metrics(
    record: Mapping[str, Any],
    member_logits: torch.Tensor,
    labels: torch.Tensor,
    ood_member_logits: Mapping[str, torch.Tensor],
    *,
    n_boot: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """The decisions of ``record`` on labelled test outputs ``(N, M, C)`` and each OOD set's outputs.

    Returns ``coverage`` and ``set_size`` (with bootstrap intervals when ``n_boot``), ``answered``,
    ``selective_accuracy`` (None without a threshold), ``aurc`` (ranked by the abstention score), the
    risk-coverage ``curve`` and per OOD set ``refused``, ``set_gt1`` and ``refused_or_set_gt1``.
    """
    decided = calibrated_decisions(member_logits, record)
    sets = decided["prediction_set"]  # (N, C)
    covered = sets[torch.arange(labels.numel()), labels.long()].double()  # (N,)
    size = sets.sum(dim=-1).double()  # (N,)
    member_probs = calibrated_member_probs(member_logits, record)
    probs = member_probs.mean(dim=1)  # (N, C)
    correct = (probs.argmax(dim=-1) == labels.long()).double()
    value = decided["abstain_value"]  # (N,) higher = less sure
    out: dict[str, Any] = {
        "alpha": record["alpha"], "method": record["method"], "randomized": bool(record.get("randomized")),
        "n_calibration": record["n"], "q_hat": record["q_hat"],
        "coverage": float(covered.mean()), "set_size": float(size.mean()),
        "coverage_ci": _interval(lambda i: covered[i].mean(), labels.numel(), n_boot, seed),
        "set_size_ci": _interval(lambda i: size[i].mean(), labels.numel(), n_boot, seed + 1),
        "score": record.get("score"), "threshold": record.get("threshold"), "risk": record.get("risk"),
        "aurc": metrics.aurc(probs, labels, confidence=-value),
    }
    if record.get("selective_error"):
        out["selective_error"] = record["selective_error"]
    if decided["abstain"] is None:
        out.update(answered=None, selective_accuracy=None)
    else:
        answered = (~decided["abstain"]).double()
        out["answered"] = float(answered.mean())
        out["selective_accuracy"] = float((correct * answered).sum() / answered.sum()) if answered.sum() else None

        def accuracy(i: torch.Tensor) -> torch.Tensor:
            kept = answered[i]
            return (correct[i] * kept).sum() / kept.sum() if kept.sum() else torch.tensor(float("nan"))

        out["selective_accuracy_ci"] = _interval(accuracy, labels.numel(), n_boot, seed + 2)
    order = value.argsort(stable=True)  # surest first
    errors = (1 - correct[order]).cumsum(0)
    k = torch.arange(1, labels.numel() + 1, dtype=torch.float64)
    points = torch.linspace(0, labels.numel() - 1, min(labels.numel(), 100)).round().long().unique()
    out["curve"] = {"coverage": (k[points] / labels.numel()).tolist(), "risk": (errors[points] / k[points]).tolist()}
    out["ood"] = {}
    for name, logits in ood_member_logits.items():
        ood = calibrated_decisions(logits, record)
        big = ood["prediction_set"].sum(dim=-1) > 1
        refused = ood["abstain"] if ood["abstain"] is not None else torch.zeros_like(big)
        out["ood"][name] = {
            "refused": float(refused.double().mean()) if ood["abstain"] is not None else None,
            "set_gt1": float(big.double().mean()),
            "refused_or_set_gt1": float((refused | big).double().mean()),
        }
    return out


def _pct(value: Any, interval: Mapping[str, float] | None = None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{100 * value:.1f}"
    return text + (f" [{100 * interval['ci_low']:.1f}, {100 * interval['ci_high']:.1f}]" if interval else "")


def render_decisions(decisions: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The decisions table (Markdown): one line per model and alpha."""
    ood_names = sorted({o for rows in decisions.values() for row in rows for o in row["ood"]})
    head = ["model", "α", "method", "n cal", "coverage %", "mean set size", "score", "threshold", "answered %",
            "selective acc. %", "AURC ↓", *[f"{o}: refused / set>1 / either %" for o in ood_names]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rows in decisions.items():
        for row in rows:
            size = f"{row['set_size']:.3f}" + (
                f" [{row['set_size_ci']['ci_low']:.3f}, {row['set_size_ci']['ci_high']:.3f}]"
                if row.get("set_size_ci")
                else ""
            )
            method = row["method"] + (" (randomised)" if row.get("randomized") else "")
            cells = [
                f"{name} ({row.get('source', 'val')})",
                f"{row['alpha']:g}",
                method,
                str(row["n_calibration"]),
                _pct(row["coverage"], row.get("coverage_ci")),
                size,
                str(row["score"]),
                "–" if row["threshold"] is None else f"{row['threshold']:.4g}",
                _pct(row["answered"]),
                _pct(row["selective_accuracy"], row.get("selective_accuracy_ci")),
                f"{row['aurc']:.4f}",
            ]
            for o in ood_names:
                d = row["ood"].get(o)
                cells.append(
                    "–"
                    if d is None
                    else f"{_pct(d['refused'])} / {_pct(d['set_gt1'])} / {_pct(d['refused_or_set_gt1'])}"
                )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def risk_coverage_figure(decisions: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike) -> str:
    """The risk-coverage curves of :func:`decision_metrics` rows (each model's first), thresholds as dots."""
    curves = {}
    for name, rows in decisions.items():
        row = rows[0]
        point = None
        if row["answered"] is not None and row["selective_accuracy"] is not None:
            point = (row["answered"], 1 - row["selective_accuracy"])
        curves[f"{name} ({row['score']})"] = (row["curve"]["coverage"], row["curve"]["risk"], point, row.get("risk"))
    return risk_coverage_diagram(curves, path)
