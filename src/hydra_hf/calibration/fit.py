"""Fit a calibration (conformal sets and a risk-controlling abstention threshold) on labelled
calibration data, and write it into a copy of a Hydra folder's ``config.json`` under ``calibration``.

The shipped pipelines (``pipeline_hydra.add_calibrated_decision``) and the ONNX predictor read that key
and add ``prediction_set`` and ``abstain`` to every result, with the same functions used here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .. import evaluation as ev
from ..data import (
    data_spec_paths,
    read_templates,
    resolve_dataset,
    zero_shot_class_names,
    zero_shot_data,
    zero_shot_paths,
)
from ..errors import HydraInputError
from ..evaluation.loading import load_causal_lm, zero_shot_family
from ..evaluation.zero_shot import load_zero_shot_model
from ..families import is_causal_lm_folder
from ..metrics import SEQUENCE_SCORES, resolve_score, stored_score
from ..modeling.configuration_hydra import check_calibration
from ..modeling.pipeline_hydra import RANDOMIZED_METHODS, ZERO_SHOT_TEMPLATE, calibrated_member_probs
from ..outputs import MARKER, check_output, read_json, regular_files, write_output_folder, write_text_atomic
from ..version import __version__
from .conformal import CONFORMAL_METHODS, check_alpha, fit_conformal
from .generation import GENERATION_SCORES, fit_generation_abstention
from .selective import fit_selective

__all__ = ["CONFIG_KEY", "calibrate_folder", "data_sha256", "fit_calibration", "guarantee_text"]

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
        t = ev.fit_temperature(ev.Predictions(member_logits[part], labels[part]))
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


def calibrate_folder(
    folder: str | os.PathLike,
    data: str,
    output: str | os.PathLike,
    *,
    alpha: float = 0.1,
    method: str = "lac",
    score: str | None = None,
    risk: float | None = 0.1,
    delta: float | None = None,
    temperature: float | str | None = None,
    penalty: float | None = None,
    regularization_rank: int | None = None,
    randomized: bool = False,
    seed: int = 0,
    text_column: str = "text",
    label_column: str = "label",
    image_column: str | None = None,
    max_samples: int | None = None,
    batch_size: int = 32,
    max_length: int = 128,
    class_names: str | None = None,
    templates: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Copy the Hydra classifier ``folder`` to ``output`` with a calibration fitted on the labelled
    ``data`` (a file, folder or ``NAME:SPLIT``) in its ``config.json``. ``folder`` is never changed;
    every error leaves ``output`` as it was. ``overwrite`` replaces an existing calibration of ``folder``
    (and an earlier ``hydra-hf calibrate`` output). Returns the stored calibration.

    ``score`` (default ``msp``; a causal LM: ``mutual_information``) decides abstention. A causal LM folder gets
    :func:`~hydra_hf.calibration.generation.fit_generation_abstention` thresholds fitted on the texts of
    ``data`` (no labels; ``method``, ``risk``, ``delta`` and ``temperature`` do not apply). A two-tower
    (CLIP / SigLIP) folder classifies ``class_names`` (default: the sub-folders of an image folder ``data``)
    with the prompt ``templates`` (default: the zero-shot pipeline's ``"This is a photo of {}."``); both are
    stored, and its pipeline decides only for those classes and that one template.

    ``delta`` (default 0.1) applies only with a ``risk``, ``penalty`` (RAPS' lambda, default 0.1) and
    ``regularization_rank`` (its k_reg, default 1) only to ``method="raps"``: given where they do not apply,
    they are refused, as every setting is, before the model is loaded."""
    check_alpha(alpha, "--alpha")  # bad flags fail before the model is loaded
    if risk is None and delta is not None:
        raise HydraInputError(f"--delta {delta!r} is the confidence of the --risk guarantee, but --risk none fits no "
                              "abstention threshold; drop --delta or give --risk")
    given = [(flag, value) for flag, value in (("--raps-penalty", penalty), ("--raps-rank", regularization_rank))
             if value is not None]
    if given and method != "raps":
        flag, value = given[0]
        raise HydraInputError(f"{flag} {value!r} applies to --method raps, not {method}; drop it or pick --method "
                              "raps")
    explicit = {flag: value for flag, value in (("--delta", delta), *given) if value is not None}
    delta = DEFAULT_DELTA if delta is None else delta
    penalty = DEFAULT_PENALTY if penalty is None else penalty
    regularization_rank = DEFAULT_RANK if regularization_rank is None else regularization_rank
    if risk is not None:
        check_alpha(risk, "--risk")
        check_alpha(delta, "--delta")
    check_settings(method=method, temperature=temperature, penalty=penalty, regularization_rank=regularization_rank,
                   randomized=randomized)
    config_file = Path(folder) / "config.json"
    if not config_file.is_file():
        raise HydraInputError(f"{str(folder)!r} has no config.json; pass a Hydra Ensemble classifier folder")
    config_data = read_json(config_file, what="model config", fix="pass a Hydra Ensemble classifier folder")
    if not isinstance(config_data, dict) or not config_data.get("num_members"):
        raise HydraInputError(f"{str(folder)!r} is not a Hydra Ensemble folder (config.json names no members); "
                              "calibrate a folder written by `hydra-hf convert` or `hydra-hf finetune`")
    if config_data.get(CONFIG_KEY) is not None and not overwrite:
        raise HydraInputError(
            f"{str(folder)!r} is already calibrated (config.json has {CONFIG_KEY!r}); pass --overwrite to replace its "
            "calibration"
        )
    # every file it reads: the output never holds one (--overwrite would delete it with the old output)
    inputs = [Path(folder), *data_spec_paths(data), *zero_shot_paths(class_names, templates)]
    check_output(output, command="calibrate", overwrite=overwrite, inputs=inputs)  # before any work
    if is_causal_lm_folder(folder):
        given = score or "mutual_information"
        score = resolve_score(given, "sequence").stored  # the spelling config.calibration holds
        if score not in GENERATION_SCORES:
            usable = [s.name for s in SEQUENCE_SCORES.values() if s.stored in GENERATION_SCORES]
            raise HydraInputError(f"--score {given!r} does not apply to a causal LM; use one of {', '.join(usable)}")
        if temperature is not None or randomized or explicit:
            flag = ("--temperature" if temperature is not None else "--randomized" if randomized
                    else next(iter(explicit)))
            raise HydraInputError(f"{flag} does not apply to a causal LM's abstention thresholds; drop it")
        lm, tokenizer = load_causal_lm(folder)
        dataset = resolve_dataset(data, text_column=text_column, label_column=None, max_samples=max_samples)
        if "text" not in dataset.column_names:
            raise HydraInputError(f"--data {data!r} has columns {dataset.column_names} and no texts; name them with "
                                  "--text-column")
        calibration = fit_generation_abstention(lm, tokenizer, list(dataset["text"]), alpha=alpha, score=score,
                                                max_length=max_length, batch_size=batch_size)
        calibration.update({"data": data, "data_sha256": data_sha256(dataset)})
        _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
        return calibration
    score = score or "msp"
    family = zero_shot_family(folder)
    if family is not None:
        names = zero_shot_class_names(class_names, data, model=f"a {family.name} model")
        prompts = read_templates(templates if templates is not None else [ZERO_SHOT_TEMPLATE])
        dataset = resolve_dataset(data, text_column=text_column, image_column=image_column, label_column=label_column,
                                  require_labels=True, label2id={n: i for i, n in enumerate(names)},
                                  max_samples=max_samples)
        dataset = zero_shot_data(dataset, names, f"--data {data!r}", f"a zero-shot {family.name} model")
        zero_shot = load_zero_shot_model(folder)
        loader = ev.make_loader(dataset, zero_shot.image_processor, "image", batch_size=batch_size)
        predictions = ev.predict(zero_shot.predictor(names, prompts), loader, desc="calibration")
        calibration = fit_calibration(predictions.member_logits, predictions.labels, alpha=alpha, method=method,
                                      score=score, risk=risk, delta=delta, temperature=temperature, penalty=penalty,
                                      regularization_rank=regularization_rank, randomized=randomized, seed=seed)
        calibration.update({"class_names": names, "templates": prompts, "data": data,
                            "data_sha256": data_sha256(dataset), "hydra_hf_version": __version__})
        _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
        return calibration
    if class_names is not None or templates is not None:
        raise HydraInputError("--class-names / --templates apply to zero-shot CLIP / SigLIP folders; this folder is a "
                              "classifier with its own classes: drop them")
    model, preprocessor, modality = ev.load_classifier(folder)
    if isinstance(model, torch.nn.Module) and not hasattr(model.config, "num_members"):
        raise HydraInputError(f"{str(folder)!r} is not a Hydra Ensemble classifier")
    dataset = resolve_dataset(
        data, text_column=text_column if modality == "text" else None, label_column=label_column,
        image_column=image_column if modality == "image" else None, label2id=model.config.label2id,
        num_labels=model.config.num_labels, require_labels=True, max_samples=max_samples)
    predictions = ev.predict(
        ev.ModelPredictor(model),
        ev.make_loader(dataset, preprocessor, modality, batch_size=batch_size, max_length=max_length),
        desc="calibration",
    )
    calibration = fit_calibration(
        predictions.member_logits,
        predictions.labels,
        alpha=alpha,
        method=method,
        score=score,
        risk=risk,
        delta=delta,
        temperature=temperature,
        penalty=penalty,
        regularization_rank=regularization_rank,
        randomized=randomized,
        seed=seed,
    )
    calibration.update({"data": data, "data_sha256": data_sha256(dataset), "hydra_hf_version": __version__})
    if "temperature_part" in calibration:
        calibration["n_total"] = int(predictions.labels.numel())

    _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
    logger.info("calibrated %s -> %s: %s", folder, output, guarantee_text(calibration))
    return calibration


def _write_calibrated_copy(folder: str | os.PathLike, output: str | os.PathLike, calibration: dict[str, Any],
                           overwrite: bool, inputs: list[Path]) -> None:
    """``output`` = every file of ``folder`` (not its command marker) with ``calibration`` in config.json."""

    def write(tmp: Path) -> None:
        for relative in regular_files(folder, what="model folder"):
            if relative.name == MARKER and relative.parent == Path("."):
                continue  # the output gets the marker of `hydra-hf calibrate`
            (tmp / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(folder) / relative, tmp / relative)
        config = json.loads((tmp / "config.json").read_text())
        config[CONFIG_KEY] = calibration
        write_text_atomic(tmp / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")

    write_output_folder(output, write, command="calibrate", overwrite=overwrite, inputs=inputs)
