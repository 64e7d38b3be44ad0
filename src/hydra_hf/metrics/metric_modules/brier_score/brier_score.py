"""Multi-class Brier score as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.brier_score`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("brier_score"))``; the numbers are
exactly those of the plain function.
"""

import evaluate
import numpy as np

from hydra_hf.metrics import brier_score
from hydra_hf.metrics.hf_evaluate import PROBS_FEATURES, metric_info, stack_rows

_DESCRIPTION = """
Multi-class Brier score mean_n sum_c (p_nc - 1[c = y_n])^2, in [0, 2] (not divided by the
number of classes). Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N probability vectors, each of length C and summing to 1 (e.g. a model's softmax
        outputs, or for a Hydra ensemble the mean of the members' softmaxes).
    references: N integer class labels in [0, C).
Returns:
    brier_score (float): in [0, 2].
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("brier_score"))
    >>> metric.compute(predictions=[[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
"""

_CITATION = """
Brier. Verification of Forecasts Expressed in Terms of Probability. Monthly Weather Review, 1950.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BrierScore(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, PROBS_FEATURES)

    def _compute(self, predictions, references):
        probs = stack_rows(predictions, "predictions")  # (N, C)
        labels = np.asarray(references, dtype=np.int64)  # (N,)
        return {"brier_score": brier_score(probs, labels)}
