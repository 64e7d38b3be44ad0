"""The run: every predictor's metrics on the labelled ID data and each OOD set (one row each), latency
and parameters; paired bootstrap comparisons of two rows; what identifies a model's recipe."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from .. import metrics
from .predictors import Predictions, Predictor, interleaved_latency_ms, predict, reuse_forwards

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------- evaluating
@dataclass
class EvaluationResult:
    rows: list[dict[str, Any]]
    id_predictions: dict[str, Predictions]
    ood_predictions: dict[str, dict[str, Predictions]]
    score: str
    scores: dict[str, str] = field(default_factory=dict)  # per-row OOD scores that differ from ``score``
    latency_batch: int | None = None  # inputs in the batch the latency column was timed on (None: not timed)

    def score_of(self, name: str) -> str:
        """The OOD score of the row ``name``."""
        return self.scores.get(name, self.score)


def evaluate_predictors(
    predictors: Mapping[str, Predictor],
    id_loader: Iterable,
    ood_loaders: Mapping[str, Iterable],
    *,
    score: str = "msp",
    scores: Mapping[str, str] | None = None,
    n_bins: int = 15,
    latency_batch: Mapping[str, torch.Tensor] | None = None,
) -> EvaluationResult:
    """Metrics of every predictor: calibration on the labelled ID data, OOD detection against each
    OOD set with ``score`` (higher = more ID; ``scores`` overrides it for some rows, e.g. mutual
    information for an ensemble whose recipe chose it), latency on ``latency_batch`` and parameters.
    Every row records its ``ood_score``."""
    scores = dict(scores or {})
    for name, value in {"*": score, **scores}.items():
        if value not in metrics.OOD_SCORE_NAMES:
            raise ValueError(f"unknown OOD score {value!r}; use one of {list(metrics.OOD_SCORE_NAMES)}")
        if name != "*" and name not in predictors:
            raise ValueError(f"scores names {name!r}, which is not one of the predictors {list(predictors)}")
    rows, id_preds, ood_preds = [], {}, {}
    with reuse_forwards():  # rows sharing a model (Single, Single + TS, Deep Ensemble member 0) run it once
        for name, predictor in predictors.items():
            rows.append(
                _evaluate_row(name, predictor, id_loader, ood_loaders, score, scores, n_bins, id_preds, ood_preds)
            )
    batch_size = None
    if latency_batch is not None:
        for row, ms in zip(rows, interleaved_latency_ms(list(predictors.values()), latency_batch)):
            row["latency_ms"] = ms
        batch_size = len(next(iter(latency_batch.values())))
    return EvaluationResult(rows=rows, id_predictions=id_preds, ood_predictions=ood_preds, score=score,
                            scores={k: v for k, v in scores.items() if v != score}, latency_batch=batch_size)


def _evaluate_row(
    name: str,
    predictor: Predictor,
    id_loader: Iterable,
    ood_loaders: Mapping[str, Iterable],
    score: str,
    scores: Mapping[str, str],
    n_bins: int,
    id_preds: dict,
    ood_preds: dict,
) -> dict[str, Any]:
    """One row of :func:`evaluate_predictors` (its predictions go into ``id_preds`` / ``ood_preds``)."""
    logger.info("evaluating %s", name)
    preds = predict(predictor, id_loader, desc=f"{name}: ID")
    if preds.labels is None:
        raise ValueError("the in-distribution data has no labels; pass labelled --id-data")
    member_probs = preds.member_probs if preds.member_logits.shape[1] > 1 else None
    row: dict[str, Any] = {
        "method": name,
        **metrics.calibration_report(preds.probs, preds.labels, member_probs, n_bins=n_bins),
    }
    row_score = scores.get(name, score)
    id_scores = preds.ood_scores(row_score)
    ood_preds[name] = {}
    for ood_name, loader in ood_loaders.items():
        ood = predict(predictor, loader, desc=f"{name}: {ood_name}")
        ood_preds[name][ood_name] = ood
        row[ood_name] = metrics.ood_report(id_scores, ood.ood_scores(row_score))
    row["ood_score"] = row_score
    row["params_m"] = predictor.num_parameters() / 1e6
    compute = predictor.compute_ratio()
    if compute is not None:
        row["compute_x"] = compute  # multiply-adds per token relative to the Single (hydra_hf.cost)
    row["members"] = int(preds.member_logits.shape[1])
    recipe = recipe_of(predictor)
    if recipe is not None:
        row["recipe"] = recipe
    id_preds[name] = preds
    return row


_KEPT_HEAD_FIELDS = ("kept_heads", "vision_kept_heads", "text_kept_heads")


def recipe_of(model: Any) -> str | None:
    """What identifies the recipe a model (or a predictor holding one) comes from, which seeds of one recipe
    share: the base architecture (type, layers, heads, width, vocabulary) and, for a Hydra model, its members
    and the attention heads they keep in all (``aggregate`` compares it). Not the parameter count: seeds of a
    Llama recipe keep the same number of query heads but, with grouped-query attention, a different number of
    the key/value heads those read. None when no config is found."""
    config = getattr(model, "config", None)
    if not isinstance(config, PretrainedConfig) and isinstance(model, nn.Module):
        config = next((m.config for m in model.modules() if isinstance(getattr(m, "config", None), PretrainedConfig)),
                      None)
    if not isinstance(config, PretrainedConfig):
        return None
    model_type = getattr(config, "base_model_type", None) or config.model_type
    shape = [
        getattr(config, key, None) for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")
    ]
    recipe = f"{model_type}: {shape[0]} layers x {shape[1]} heads, width {shape[2]}, vocabulary {shape[3]}"
    kept = [getattr(config, field, None) or [] for field in _KEPT_HEAD_FIELDS]
    if any(kept):
        members = max(len(k) for k in kept)
        heads = sum(len(layer) for tower in kept for member in tower for layer in member)
        recipe += f"; {members} members keeping {heads} heads"
    return recipe


# metric -> (computed on, higher is better)
COMPARED_METRICS: dict[str, tuple[str, bool]] = {
    "accuracy": ("id", True), "nll": ("id", False), "ece": ("id", False), "brier": ("id", False),
    "auroc": ("ood", True), "fpr95": ("ood", False),
}  # fmt: skip  # a table: the in-distribution metrics on one row, the OOD ones on the next


def compare_predictions(
    result: EvaluationResult,
    target: str,
    reference: str,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    n_bins: int = 15,
) -> dict[str, dict[str, Any]]:
    """Paired bootstrap intervals of ``target`` minus ``reference`` for accuracy, NLL, ECE and Brier
    (ID examples resampled) and AUROC / FPR95 of every OOD set (ID and OOD examples resampled
    independently), with a verdict per metric: ``better``, ``worse`` or ``tie`` (the interval holds 0).

    Returns ``{metric: {difference, ci_low, ci_high, level, n_boot, verdict}}``; OOD metrics are
    named ``"<ood set>.auroc"``.
    """
    for name in (target, reference):
        if name not in result.id_predictions:
            raise ValueError(f"cannot compare {name!r}: the evaluated models are {sorted(result.id_predictions)}")
    a, b = result.id_predictions[target], result.id_predictions[reference]
    if a.labels is None or not torch.equal(a.labels, b.labels):
        raise ValueError(f"{target!r} and {reference!r} were not evaluated on the same labelled examples")
    pa, pb, labels = a.probs, b.probs, a.labels
    id_functions = {
        "accuracy": metrics.accuracy, "nll": metrics.nll, "brier": metrics.brier_score,
        "ece": lambda p, y: metrics.ece(p, y, n_bins),
    }
    out: dict[str, dict[str, Any]] = {}
    for offset, (name, fn) in enumerate(id_functions.items()):
        interval = metrics.paired_bootstrap(
            lambda i, fn=fn: fn(pa[i], labels[i]) - fn(pb[i], labels[i]),
            (len(labels),),
            n_boot=n_boot,
            seed=seed + offset,
            level=level,
        )
        out[name] = {**interval, "verdict": metrics.bootstrap_verdict(interval, COMPARED_METRICS[name][1])}
    sa, sb = a.ood_scores(result.score_of(target)), b.ood_scores(result.score_of(reference))
    ood_functions = {"auroc": metrics.ood_auroc, "fpr95": metrics.fpr_at_95_tpr}
    for k, ood_name in enumerate(sorted(result.ood_predictions[target])):
        oa = result.ood_predictions[target][ood_name].ood_scores(result.score_of(target))
        ob = result.ood_predictions[reference][ood_name].ood_scores(result.score_of(reference))
        for offset, (name, fn) in enumerate(ood_functions.items()):
            interval = metrics.paired_bootstrap(
                lambda i, j, fn=fn: fn(sa[i], oa[j]) - fn(sb[i], ob[j]), (len(sa), len(oa)),
                n_boot=n_boot, seed=seed + 100 * (k + 1) + offset, level=level)
            out[f"{ood_name}.{name}"] = {
                **interval,
                "verdict": metrics.bootstrap_verdict(interval, COMPARED_METRICS[name][1]),
            }
    return out
