"""False-positive rate at 95 % TPR (FPR95) as an ``evaluate`` metric, backed by :func:`hydra_hf.metrics.fpr_at_95_tpr`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("fpr95"))``; the numbers are
exactly those of the plain function on the ID / OOD split of the inputs.
"""

import evaluate

from hydra_hf.metrics import fpr_at_95_tpr
from hydra_hf.metrics.hf_evaluate import SCORES_FEATURES, metric_info, split_ood_scores

_DESCRIPTION = """
Fraction of OOD samples accepted (score >= t) at the largest threshold t that accepts at least
95 % of the in-distribution samples. Lower is better.

Scores follow the convention "higher = more in-distribution" (e.g. the maximum softmax
probability); references say which samples are in-distribution (1) and which are OOD (0).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N OOD scores, higher = more in-distribution.
    references: N labels, 1 for an in-distribution sample and 0 for an OOD sample; both values
        must occur.
    tpr: the true-positive rate to reach (default 0.95).
Returns:
    fpr95 (float): in [0, 1].
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("fpr95"))
    >>> metric.compute(predictions=[0.9, 0.8, 0.4, 0.3], references=[1, 1, 0, 0])
"""

_CITATION = """
Liang, Li, Srikant. Enhancing The Reliability of Out-of-distribution Image Detection in Neural Networks. ICLR 2018.
"""



@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class FPR95(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, SCORES_FEATURES)

    def _compute(self, predictions, references, tpr=0.95):
        scores_id, scores_ood = split_ood_scores(predictions, references)
        return {"fpr95": fpr_at_95_tpr(scores_id, scores_ood, tpr=tpr)}
