"""Area under the risk-coverage curve (AURC) as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.aurc`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("aurc"))``; the numbers are
exactly those of the plain function.
"""

import evaluate
import numpy as np

from hydra_hf.metrics import aurc, eaurc
from hydra_hf.metrics.hf_evaluate import PROBS_FEATURES, metric_info, stack_rows

_DESCRIPTION = """
Selective classification: samples are ranked by their maximum softmax probability and the
selective risk (error rate of the argmax among the k most confident samples) is averaged over
all coverages k/N. Also returns the excess AURC over an oracle ranking. Lower is better.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N probability vectors, each of length C and summing to 1 (e.g. a model's softmax
        outputs, or for a Hydra ensemble the mean of the members' softmaxes).
    references: N integer class labels in [0, C).
Returns:
    aurc (float): in [0, 1].
    eaurc (float): aurc minus the oracle's aurc on the same samples, >= 0.
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("aurc"))
    >>> metric.compute(predictions=[[0.9, 0.1], [0.3, 0.7], [0.6, 0.4]], references=[0, 1, 1])
"""

_CITATION = """
Geifman, Uziel, El-Yaniv. Bias-Reduced Uncertainty Estimation for Deep Neural Classifiers. ICLR 2019.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class AURC(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, PROBS_FEATURES)

    def _compute(self, predictions, references):
        probs = stack_rows(predictions, "predictions")  # (N, C)
        labels = np.asarray(references, dtype=np.int64)  # (N,)
        return {"aurc": aurc(probs, labels), "eaurc": eaurc(probs, labels)}
