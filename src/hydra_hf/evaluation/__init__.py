"""Evaluation: the baselines of the paper wrapped as predictors (:mod:`.predictors`), loading a model
folder and its data (:mod:`.loading`), the run of every predictor on ID and OOD data (:mod:`.run`), the
report files and figures (:mod:`.report`, :mod:`.plots`), causal LMs (:mod:`.causal_lm`), zero-shot folders
(:mod:`.zero_shot`), a causal LM as a zero-shot classifier (:mod:`.zero_shot_lm`) and the ONNX int8 quality check
(:mod:`.onnx_check`). ``hydra-hf evaluate`` as one call is :func:`hydra_hf.workflows.evaluate.evaluate_folder`;
the shipped pipelines' uncertainty threshold (``fit_uncertainty_threshold``, re-exported here) is
:mod:`hydra_hf.calibration.thresholds`'.

Every model is wrapped in a :class:`Predictor` that returns *member logits* ``(B, M, C)``; the
ensemble prediction is always the mean of the members' softmaxes, so all baselines go through the
same metric code. The names below are the package's public face (``from hydra_hf.evaluation import
ModelPredictor, make_loader, predict``)."""

from ..calibration.thresholds import UNCERTAINTY_METRICS, fit_uncertainty_threshold
from ..data import make_loader, zero_shot_prompts
from .loading import (
    check_deep_ensemble_model,
    fit_tokenizer_to_model,
    load_classifier,
    max_text_positions,
)
from .predictors import (
    EnsemblePredictor,
    HeadsEnsemblePredictor,
    MCDropoutPredictor,
    ModelPredictor,
    Predictions,
    Predictor,
    TemperatureScaledPredictor,
    ZeroShotPredictor,
    classifier_layer,
    fit_temperature,
    interleaved_latency_ms,
    model_compute_ratio,
    pooled_features,
    predict,
    reuse_forwards,
    train_ensemble_heads,
)
from .report import write_evaluation_report
from .run import COMPARED_METRICS, EvaluationResult, compare_predictions, evaluate_predictors, recipe_of
from .zero_shot_lm import ZeroShotLMPredictor, make_text_batches

__all__ = [
    "COMPARED_METRICS",
    "EnsemblePredictor",
    "EvaluationResult",
    "HeadsEnsemblePredictor",
    "MCDropoutPredictor",
    "ModelPredictor",
    "Predictions",
    "Predictor",
    "TemperatureScaledPredictor",
    "UNCERTAINTY_METRICS",
    "ZeroShotLMPredictor",
    "ZeroShotPredictor",
    "check_deep_ensemble_model",
    "classifier_layer",
    "compare_predictions",
    "evaluate_predictors",
    "fit_temperature",
    "fit_tokenizer_to_model",
    "fit_uncertainty_threshold",
    "interleaved_latency_ms",
    "make_text_batches",
    "load_classifier",
    "make_loader",
    "max_text_positions",
    "model_compute_ratio",
    "pooled_features",
    "predict",
    "recipe_of",
    "reuse_forwards",
    "train_ensemble_heads",
    "write_evaluation_report",
    "zero_shot_prompts",
]
