"""Ensemble mutual information as an ``evaluate`` metric, backed by
:func:`hydra_hf.metrics.mutual_information`.

Load it offline with ``evaluate.load(hydra_hf.metrics.module_path("mutual_information"))``; the
numbers are exactly the dataset means of the plain per-sample functions.
"""

import datasets
import evaluate
import numpy as np

from hydra_hf.metrics import expected_entropy, mutual_information, predictive_entropy

_DESCRIPTION = """
Decomposition of an ensemble's predictive uncertainty (in nats), averaged over samples:
predictive entropy H(mean_m p_m) = expected entropy mean_m H(p_m) (aleatoric) + mutual
information (epistemic, the members' disagreement). No labels are needed.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: N samples, each a list of M member probability vectors of length C (shape
        (N, M, C); every vector sums to 1).
Returns:
    mutual_information (float): mean epistemic uncertainty, >= 0.
    predictive_entropy (float): mean entropy of the ensemble-mean prediction.
    expected_entropy (float): mean of the members' entropies.
Examples:
    >>> metric = evaluate.load(hydra_hf.metrics.module_path("mutual_information"))
    >>> metric.compute(predictions=[[[0.9, 0.1], [0.2, 0.8]], [[0.5, 0.5], [0.5, 0.5]]])
"""

_CITATION = """
Depeweg, Hernandez-Lobato, Doshi-Velez, Udluft. Decomposition of Uncertainty in Bayesian Deep
Learning for Efficient and Risk-sensitive Learning. ICML 2018.
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MutualInformation(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Sequence(datasets.Sequence(datasets.Value("float64")))}
            ),
        )

    def _compute(self, predictions):
        try:
            member_probs = np.asarray(predictions, dtype=np.float64)  # (N, M, C)
        except ValueError as err:
            raise ValueError(f"predictions must have shape (N, M, C) with the same M and C everywhere: {err}") from err
        return {
            "mutual_information": float(mutual_information(member_probs).mean()),
            "predictive_entropy": float(predictive_entropy(member_probs).mean()),
            "expected_entropy": float(expected_entropy(member_probs).mean()),
        }
