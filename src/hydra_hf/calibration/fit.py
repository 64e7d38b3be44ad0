"""What ``config.calibration`` stores, fitted on a model's outputs: conformal sets and a risk-controlling
abstention threshold (:func:`fit_calibration`, on tensors), the hash of the data they were fitted on and
their guarantee in words. ``hydra-hf calibrate`` (:mod:`hydra_hf.workflows.calibrate`) predicts on the
data and writes the calibrated copy of a folder.

The shipped pipelines (``pipeline_hydra.add_calibrated_decision``) and the ONNX predictor read that key
and add ``prediction_set`` and ``abstain`` to every result, with the same functions used here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

import torch

from ..errors import HydraInputError
from ..metrics import stored_score
from ..modeling.configuration_hydra import check_calibration
from ..modeling.pipeline_hydra import RANDOMIZED_METHODS, calibrated_member_probs
from .conformal import CONFORMAL_METHODS, check_alpha, fit_conformal
from .selective import fit_selective
from .temperature import fit_temperature

__all__ = ["CONFIG_KEY", "DEFAULT_DELTA", "DEFAULT_PENALTY", "DEFAULT_RANK", "check_settings", "data_sha256",
           "fit_calibration", "guarantee_text"]

logger = logging.getLogger(__name__)

CONFIG_KEY = "calibration"
TEMPERATURE_SEED = 0
DEFAULT_DELTA = 0.1  # the confidence 1 - delta of the risk guarantee
DEFAULT_PENALTY, DEFAULT_RANK = 0.1, 1  # RAPS' lambda and k_reg


def check_settings(*, method: str, temperature: float | str | None, penalty: float, regularization_rank: int,
                   randomized: bool) -> None:
    """The fitting settings, checked before anything is predicted: one line each, naming the flag."""
    if method not in CONFORMAL_METHODS:
        raise HydraInputError(f"--method {method!r} is unknown; use one of {', '.join(CONFORMAL_METHODS)}")
    if temperature is not None and temperature != "fit" and (
        isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf
    ):
        raise HydraInputError(f"--temperature {temperature!r} must be a positive number (1: the model's own "
                              "probabilities) or 'fit'")
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not 0 <= penalty < math.inf:
        raise HydraInputError(f"--raps-penalty {penalty!r} must be a finite number >= 0 (RAPS' lambda, e.g. 0.1)")
    if isinstance(regularization_rank, bool) or not isinstance(regularization_rank, int) or regularization_rank < 0:
        raise HydraInputError(f"--raps-rank {regularization_rank!r} must be a whole number >= 0 (e.g. 1)")
    if randomized and method not in RANDOMIZED_METHODS:
        raise HydraInputError(f"--randomized applies to {' and '.join(RANDOMIZED_METHODS)}, not {method} (its score "
                              "1 - p_y needs no tie-breaking); drop --randomized or pick --method aps")


def fit_calibration(
    member_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    alpha: float = 0.1,
    method: str = "lac",
    score: str = "msp",
    risk: float | None = 0.1,
    delta: float = 0.1,
    temperature: float | str | None = None,
    penalty: float = 0.1,
    regularization_rank: int = 1,
    randomized: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """What ``config.calibration`` stores, fitted on calibration outputs.

    Args:
        member_logits: ``(n, M, C)`` the members' logits on the calibration data.
        labels: ``(n,)`` true classes.
        alpha: the sets' miscoverage level in (0, 1).
        method: ``lac``, ``aps`` or ``raps`` (deterministic unless ``randomized``).
        score: ``msp``, ``entropy`` or ``mutual_information`` (``mi``, its old spelling): the score whose
            uncertainty decides abstention (``hydra_hf.metrics.OOD_SCORES``; stored under the spelling the
            shipped pipelines read, ``stored_score``).
        risk, delta: the error rate among answered inputs to certify, with confidence ``1 - delta``
            (Learn then Test); ``risk=None`` fits the prediction sets only.
        temperature: None (the model's own probabilities), a number, or ``"fit"``: fitted (NLL) on a
            seeded random half of the data, named ``temperature_part``; the sets and the threshold are
            then fitted on the other half only.
        randomized, seed: randomised APS / RAPS, U per input a hash of ``seed`` and its probabilities
            (``pipeline_hydra.conformal_noise``; the seed is stored).
    """
    check_alpha(alpha)
    if risk is not None:
        check_alpha(risk, "risk")
        check_alpha(delta, "delta")
    check_settings(method=method, temperature=temperature, penalty=penalty, regularization_rank=regularization_rank,
                   randomized=randomized)
    if member_logits.dim() != 3 or labels.shape != member_logits.shape[:1]:
        raise HydraInputError(f"member_logits must be (n, M, C) and labels (n,), got {tuple(member_logits.shape)} and "
                              f"{tuple(labels.shape)}")
    score = stored_score(score, "example", what="score")  # the spelling config.calibration holds
    record: dict[str, Any] = {}
    if temperature == "fit":
        order = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(TEMPERATURE_SEED))
        half = labels.numel() // 2
        if half < 1:
            raise HydraInputError(f"--temperature fit needs at least 2 calibration examples, got {labels.numel()}")
        part, rest = order[:half], order[half:]
        t = fit_temperature(member_logits[part], labels[part])
        record["temperature_part"] = {"rule": f"a random half of the data (torch.randperm, seed {TEMPERATURE_SEED})",
                                      "n": int(half)}
        member_logits, labels = member_logits[rest], labels[rest]
        temperature = t
    record["temperature"] = float(temperature) if temperature is not None else 1.0
    member_probs = calibrated_member_probs(member_logits, record)  # (n, M, C) float64
    conformal = fit_conformal(member_probs.mean(dim=1), labels, alpha, method, penalty=penalty,
                              regularization_rank=regularization_rank, randomized=randomized, seed=seed)
    record.update(conformal.to_dict())
    if risk is None:
        record.update({"score": score, "risk": None, "delta": None, "threshold": None})
    else:
        record.update(fit_selective(member_probs, labels, score, risk, delta).to_dict())
    return record


def _hash_value(value: Any, digest: Any) -> None:
    if hasattr(value, "tobytes") and hasattr(value, "mode"):  # a PIL image
        digest.update(f"image:{value.mode}:{value.size}".encode())
        digest.update(value.tobytes())
    elif isinstance(value, bytes):
        digest.update(value)
    elif isinstance(value, dict):
        for key in sorted(value):
            digest.update(str(key).encode())
            _hash_value(value[key], digest)
    else:
        digest.update(json.dumps(value, sort_keys=True, default=str).encode())
    digest.update(b"\x00")


def data_sha256(dataset: Any) -> str:
    """sha256 of a data set's rows (its ``text`` / ``image`` and ``label`` columns, in order)."""
    digest = hashlib.sha256()
    columns = [c for c in ("text", "text_pair", "image", "label") if c in dataset.column_names]
    for row in dataset.select_columns(columns):
        for column in columns:
            _hash_value(row[column], digest)
    return digest.hexdigest()


def guarantee_text(calibration: dict[str, Any]) -> str:
    """The guarantee of a stored calibration, in words (for the model card and reports); a calibration that is
    not what `hydra-hf calibrate` stores is a one-line ``ValueError`` (:func:`check_calibration`)."""
    check_calibration(calibration)
    alpha, n = calibration["alpha"], calibration["n"]
    if calibration.get("task") == "causal_lm":
        return (
            f"`generate_with_uncertainty` marks a sequence `sequence_abstain` when its mean {calibration['score']} "
            f"exceeds {calibration['sequence_threshold']:.4g}, and a token `token_abstain` above "
            f"{calibration['token_threshold']:.4g}; fitted on n = {n} in-distribution texts so that at most "
            f"{alpha:.0%} of texts like them (exchangeable with them) are refused, marginally (the token threshold "
            "has no such guarantee: about the same share of their tokens). On the model's own generations the "
            "thresholds are reference levels, not guarantees."
        )
    text = (
        f"Prediction sets ({calibration['method'].upper()}, split conformal, q_hat = {calibration['q_hat']:.4g}) hold "
        f"the true label with probability at least {1 - alpha:.0%} (alpha = {alpha:g}), fitted on n = {n} labelled "
        "examples. The coverage is marginal (on average over inputs, not for each input or each class) and holds "
        "only for inputs exchangeable with the calibration data (the same distribution); it says nothing about "
        "out-of-distribution inputs."
    )
    if calibration.get("randomized"):
        text += (f" The sets are randomised (Romano et al. 2020): an input's score subtracts U times its probability, "
                 f"U uniform in [0, 1) and drawn from the input itself (a hash of seed {calibration['seed']} and its "
                 "probabilities rounded to 4 decimals), so the same input always gets the same set; the coverage is "
                 "then close to the level, not above it by the ties' margin.")
    elif calibration["method"] in ("aps", "raps"):
        text += " The sets are deterministic (no random tie-breaking): their coverage may exceed the level."
    if calibration.get("threshold") is not None:
        text += (
            f" The model abstains when {calibration['score']} uncertainty exceeds {calibration['threshold']:.4g}; "
            f"with confidence {1 - calibration['delta']:.0%} the error rate among answered inputs like the "
            f"calibration data is at most {calibration['risk']:g} (Learn then Test, Angelopoulos et al. 2021); "
            f"it answered {calibration['answered_fraction']:.1%} of the calibration inputs."
        )
    return text
