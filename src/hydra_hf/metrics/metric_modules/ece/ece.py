"""Expected calibration error (ECE) as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.ece`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("ece"))``; the numbers are
exactly those of the plain function.
"""

import evaluate
import numpy as np

from hydra_hf.metrics import ece
from hydra_hf.metrics.hf_evaluate import PROBS_FEATURES, metric_info, stack_rows

_DESCRIPTION = """
Top-label expected calibration error with equal-width confidence bins:
ECE = sum_b (n_b / N) |acc_b - conf_b| (bins are (lower, upper]). Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N probability vectors, each of length C and summing to 1 (e.g. a model's softmax
        outputs, or for a Hydra ensemble the mean of the members' softmaxes).
    references: N integer class labels in [0, C).
    n_bins: number of equal-width bins over [0, 1] (default 15).
Returns:
    ece (float): in [0, 1].
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("ece"))
    >>> metric.compute(predictions=[[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
"""

_CITATION = """
Guo, Pleiss, Sun, Weinberger. On Calibration of Modern Neural Networks. ICML 2017.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class ECE(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, PROBS_FEATURES)

    def _compute(self, predictions, references, n_bins=15):
        probs = stack_rows(predictions, "predictions")  # (N, C)
        labels = np.asarray(references, dtype=np.int64)  # (N,)
        return {"ece": ece(probs, labels, n_bins=n_bins)}
