"""Post-hoc calibration maths on a model's outputs (tensors in, fitted values out), below evaluation:
split conformal prediction sets (:mod:`.conformal`), risk-controlled abstention (:mod:`.selective`, Learn
then Test), temperature scaling (:mod:`.temperature`), the shipped pipelines' flagging threshold
(:mod:`.thresholds`), abstention thresholds of a causal LM's generations (:mod:`.generation`), what
``config.calibration`` stores (:mod:`.fit`) and the decisions' evaluation on test outputs (:mod:`.report`).

``hydra-hf calibrate`` (predict on data, fit, write the calibrated copy of a folder) is
:func:`hydra_hf.workflows.calibrate.calibrate` (``hydra_hf.calibrate_folder``: the same with keyword options)."""

from .conformal import ConformalFit, conformal_quantile, fit_conformal, min_calibration_size, prediction_sets
from .fit import CONFIG_KEY, data_sha256, fit_calibration, guarantee_text
from .generation import fit_generation_abstention
from .selective import SelectiveFit, binomial_p_value, fit_selective
from .temperature import fit_temperature
from .thresholds import UNCERTAINTY_METRICS, fit_uncertainty_threshold

__all__ = [
    "CONFIG_KEY",
    "ConformalFit",
    "SelectiveFit",
    "UNCERTAINTY_METRICS",
    "binomial_p_value",
    "conformal_quantile",
    "data_sha256",
    "fit_calibration",
    "fit_conformal",
    "fit_generation_abstention",
    "fit_selective",
    "fit_temperature",
    "fit_uncertainty_threshold",
    "guarantee_text",
    "min_calibration_size",
    "prediction_sets",
]
