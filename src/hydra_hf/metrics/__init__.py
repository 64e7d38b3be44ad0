"""Metrics: classification, calibration and OOD detection (:mod:`.classification`), the chance levels of
a task (:mod:`.chance`: what a model that learned nothing scores), the causal-LM
next-token metrics (:mod:`.causal_lm`), ONE registry of OOD scores by level (:mod:`.scores`), the
uncertainty formulas (entropy, mutual information, the exact sigmoid ensemble: one copy, in the shipped
``hydra_hf.modeling.hydra_formulas``, which the loaded folders compute with too) and the ``evaluate`` modules
(``metric_modules/``, :func:`module_path`; their shared features in :mod:`.hf_evaluate`, imported by
the modules only: importing ``hydra_hf.metrics`` imports neither ``evaluate`` nor a plotting library).

``from hydra_hf import metrics`` then ``metrics.ece(...)``, ``metrics.OOD_SCORES``: the public names of
every submodule are here."""

from ..modeling.hydra_formulas import (
    ensemble_mutual_information,
    ensemble_sigmoid_logits,
    entropy,
    entropy_of_log_probs,
)
from . import causal_lm, chance, classification, scores
from .chance import NEAR_CHANCE_ACCURACY_MARGIN, NEAR_CHANCE_NLL_FRACTION, chance_levels, near_chance
from .classification import (
    METRIC_MODULE_NAMES,
    PROB_ATOL,
    ArrayLike,
    accuracy,
    adaptive_ece,
    as_member_probs,
    aupr_in,
    aupr_out,
    aurc,
    bootstrap_verdict,
    brier_score,
    calibration_bins,
    calibration_report,
    confidence_bins,
    disagreement,
    eaurc,
    ece,
    ece_from_confidence,
    energy_score,
    expected_entropy,
    fpr_at_95_tpr,
    module_path,
    msp,
    mutual_information,
    negative_entropy,
    negative_mutual_information,
    nll,
    ood_auroc,
    ood_report,
    paired_bootstrap,
    paired_t_over_seeds,
    pairwise_disagreement,
    predictive_entropy,
)
from .scores import (
    OOD_SCORE_NAMES,
    OOD_SCORES,
    SCORE_LEVELS,
    SCORES,
    SEQUENCE_SCORES,
    TOKEN_QUANTITIES,
    TOKEN_SCORES,
    OODScore,
    canonical_score_name,
    level_scores,
    ood_score,
    register_ood_score,
    resolve_score,
    stored_score,
)

__all__ = [
    "ArrayLike", "METRIC_MODULE_NAMES", "NEAR_CHANCE_ACCURACY_MARGIN", "NEAR_CHANCE_NLL_FRACTION", "OOD_SCORES",
    "OOD_SCORE_NAMES", "OODScore", "PROB_ATOL", "SCORES",
    "SCORE_LEVELS", "SEQUENCE_SCORES", "TOKEN_QUANTITIES", "TOKEN_SCORES", "accuracy", "adaptive_ece",
    "as_member_probs", "aupr_in", "aupr_out", "aurc", "bootstrap_verdict", "brier_score", "calibration_bins",
    "calibration_report", "causal_lm", "chance", "chance_levels", "classification", "confidence_bins",
    "disagreement", "eaurc", "ece",
    "ece_from_confidence", "energy_score", "ensemble_mutual_information", "ensemble_sigmoid_logits", "entropy",
    "entropy_of_log_probs", "expected_entropy", "fpr_at_95_tpr", "level_scores", "module_path", "msp",
    "mutual_information", "near_chance", "negative_entropy", "negative_mutual_information", "nll", "ood_auroc",
    "ood_report", "ood_score", "paired_bootstrap", "paired_t_over_seeds", "pairwise_disagreement",
    "predictive_entropy", "register_ood_score", "resolve_score", "scores", "stored_score", "canonical_score_name",
]
