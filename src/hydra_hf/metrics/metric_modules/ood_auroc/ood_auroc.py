"""OOD-detection AUROC as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.ood_auroc`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("ood_auroc"))``; the numbers are
exactly those of the plain function on the ID / OOD split of the inputs.
"""

import evaluate

from hydra_hf.metrics import ood_auroc
from hydra_hf.metrics.hf_evaluate import SCORES_FEATURES, metric_info, split_ood_scores

_DESCRIPTION = """
Area under the ROC curve for separating in-distribution (positive) from OOD samples; ties
count one half. Higher is better.

Scores follow the convention "higher = more in-distribution" (e.g. the maximum softmax
probability); references say which samples are in-distribution (1) and which are OOD (0).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N OOD scores, higher = more in-distribution.
    references: N labels, 1 for an in-distribution sample and 0 for an OOD sample; both values
        must occur.
Returns:
    auroc (float): in [0, 1].
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("ood_auroc"))
    >>> metric.compute(predictions=[0.9, 0.8, 0.4, 0.3], references=[1, 1, 0, 0])
"""

_CITATION = """
Hendrycks, Gimpel. A Baseline for Detecting Misclassified and Out-of-Distribution Examples in
Neural Networks. ICLR 2017.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class OODAUROC(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, SCORES_FEATURES)

    def _compute(self, predictions, references):
        scores_id, scores_ood = split_ood_scores(predictions, references)
        return {"auroc": ood_auroc(scores_id, scores_ood)}
