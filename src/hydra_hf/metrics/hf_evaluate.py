"""What the ``evaluate`` metric modules in ``hydra_hf/metrics/metric_modules/`` share: input features,
conversion of their list inputs, and the ID/OOD split of score inputs. Each module stays a small
file that ``evaluate.load(path)`` can load offline; the numbers come from :mod:`hydra_hf.metrics`."""

from __future__ import annotations

from typing import Any

import datasets
import evaluate
import numpy as np

# predictions: one probability vector per example; references: its class label
PROBS_FEATURES = datasets.Features(
    {"predictions": datasets.Sequence(datasets.Value("float64")), "references": datasets.Value("int64")}
)
# predictions: one OOD score per example (higher = more in-distribution); references: 1 ID / 0 OOD
SCORES_FEATURES = datasets.Features({"predictions": datasets.Value("float64"), "references": datasets.Value("int64")})


def metric_info(
    description: str, kwargs_description: str, citation: str, features: datasets.Features
) -> evaluate.MetricInfo:
    return evaluate.MetricInfo(
        description=description, citation=citation, inputs_description=kwargs_description, features=features
    )


def stack_rows(rows: Any, name: str) -> np.ndarray:
    """``rows`` (N vectors of equal length) as a float64 array, or a ``ValueError`` naming ``name``."""
    try:
        return np.asarray(rows, dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{name} must be N vectors of the same length C: {err}") from err


def split_ood_scores(predictions: Any, references: Any) -> tuple[np.ndarray, np.ndarray]:
    """Scores ``(N,)`` and 1 (ID) / 0 (OOD) references -> ``(scores_id, scores_ood)``."""
    scores = np.asarray(predictions, dtype=np.float64)  # (N,)
    is_id = np.asarray(references, dtype=np.int64)  # (N,)
    bad = sorted(set(np.unique(is_id).tolist()) - {0, 1})
    if bad:
        raise ValueError(f"references must be 1 (in-distribution) or 0 (OOD), got values {bad}")
    return scores[is_id == 1], scores[is_id == 0]
