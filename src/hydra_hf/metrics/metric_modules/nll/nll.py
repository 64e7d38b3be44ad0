"""Negative log-likelihood as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.nll`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("nll"))``; the numbers are
exactly those of the plain function.
"""

import evaluate
import numpy as np

from hydra_hf.metrics import nll
from hydra_hf.metrics.hf_evaluate import PROBS_FEATURES, metric_info, stack_rows

_DESCRIPTION = """
Mean negative log-likelihood -mean_n log p_n[y_n] in nats; probabilities are clamped to
[eps, 1] first. Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N probability vectors, each of length C and summing to 1 (e.g. a model's softmax
        outputs, or for a Hydra ensemble the mean of the members' softmaxes).
    references: N integer class labels in [0, C).
    eps: lower clamp on the true-class probability (default 1e-12).
Returns:
    nll (float): >= 0, in nats.
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("nll"))
    >>> metric.compute(predictions=[[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
"""

_CITATION = """
Gneiting, Raftery. Strictly Proper Scoring Rules, Prediction, and Estimation. JASA 2007.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class NLL(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, PROBS_FEATURES)

    def _compute(self, predictions, references, eps=1e-12):
        probs = stack_rows(predictions, "predictions")  # (N, C)
        labels = np.asarray(references, dtype=np.int64)  # (N,)
        return {"nll": nll(probs, labels, eps=eps)}
