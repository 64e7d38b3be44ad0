"""Calibrated decisions carried inside a Hydra folder: split conformal prediction sets
(:mod:`.conformal`), risk-controlled abstention (:mod:`.selective`, Learn then Test) and the fit that
writes both into ``config.json`` (:mod:`.fit`, ``hydra-hf calibrate``)."""

from .conformal import ConformalFit, conformal_quantile, fit_conformal, min_calibration_size, prediction_sets
from .fit import CONFIG_KEY, calibrate_folder, data_sha256, fit_calibration, guarantee_text
from .selective import SelectiveFit, binomial_p_value, fit_selective

__all__ = ["CONFIG_KEY", "ConformalFit", "SelectiveFit", "binomial_p_value", "calibrate_folder", "conformal_quantile",
           "data_sha256", "fit_calibration", "fit_conformal", "fit_selective", "guarantee_text", "min_calibration_size",
           "prediction_sets"]
