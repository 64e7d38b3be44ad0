"""Calibrated decisions carried inside a Hydra folder: split conformal prediction sets
(:mod:`.conformal`), risk-controlled abstention (:mod:`.selective`, Learn then Test) and the fit that
writes both into ``config.json`` (:mod:`.fit`, ``hydra-hf calibrate``); abstention thresholds of a
causal LM's generations (:mod:`.generation`); the decisions' evaluation (:mod:`.report`)."""

from .conformal import ConformalFit, conformal_quantile, fit_conformal, min_calibration_size, prediction_sets
from .fit import CONFIG_KEY, calibrate_folder, data_sha256, fit_calibration, guarantee_text
from .generation import fit_generation_abstention
from .selective import SelectiveFit, binomial_p_value, fit_selective

__all__ = [
    "CONFIG_KEY",
    "ConformalFit",
    "SelectiveFit",
    "binomial_p_value",
    "calibrate_folder",
    "conformal_quantile",
    "data_sha256",
    "fit_calibration",
    "fit_conformal",
    "fit_generation_abstention",
    "fit_selective",
    "guarantee_text",
    "min_calibration_size",
    "prediction_sets",
]
