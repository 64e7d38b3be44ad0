"""``hydra-hf calibrate``: a copy of a Hydra folder that carries calibrated decisions.

:func:`calibrate` reads a :class:`CalibrateSpec`, predicts on its labelled data (a classifier with its own
head; a CLIP / SigLIP folder zero-shot; a causal LM on unlabelled texts), fits with
:mod:`hydra_hf.calibration` (conformal sets and a risk-controlled abstention threshold, or a causal LM's
generation thresholds) and writes the copy with the fit in its ``config.json`` under ``calibration``. The
folder it reads is never changed; every error leaves the output as it was.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import evaluation as ev
from ..calibration.conformal import check_alpha
from ..calibration.fit import (
    CONFIG_KEY,
    DEFAULT_DELTA,
    DEFAULT_PENALTY,
    DEFAULT_RANK,
    check_settings,
    data_sha256,
    fit_calibration,
    guarantee_text,
)
from ..calibration.generation import GENERATION_SCORES, fit_generation_abstention
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
from ..metrics import SEQUENCE_SCORES, resolve_score
from ..modeling.pipeline_hydra import ZERO_SHOT_TEMPLATE
from ..outputs import MARKER, check_output, read_json, regular_files, write_output_folder, write_text_atomic
from ..version import __version__

__all__ = ["CalibrateSpec", "calibrate", "calibrate_folder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CalibrateSpec:
    """What ``hydra-hf calibrate`` fits; one field per option of the command (same names, same defaults).

    Attributes:
        folder: the Hydra folder to calibrate (classifier, zero-shot CLIP / SigLIP or causal LM); never changed.
        data: the calibration data (a file, folder or ``NAME:SPLIT``): labelled, held out from training; a causal
            LM: any in-distribution texts.
        output: the new, calibrated folder (must not exist or be empty, unless ``overwrite``).
        alpha: the sets' miscoverage in (0, 1).
        method: ``lac``, ``aps`` or ``raps`` (deterministic unless ``randomized``).
        score: the score whose uncertainty decides abstention (default ``msp``; a causal LM:
            ``mutual_information``).
        risk, delta: the error among answered inputs to certify (``None``: the sets only), with confidence
            ``1 - delta`` (default 0.1; only with a ``risk``).
        temperature: None, a positive number or ``"fit"`` (fitted on a seeded random half of ``data``).
        penalty, regularization_rank: RAPS' lambda (default 0.1) and k_reg (default 1); only with ``raps``.
        randomized, seed: randomised APS / RAPS scores and the seed of their U (default 0; only with
            ``randomized``).
        text_column, label_column, image_column: the columns of tabular data.
        max_samples, batch_size, max_length: the first N examples; examples per forward pass; text truncation.
        class_names, templates: zero-shot folders' classes and prompt templates.
        overwrite: replace the folder's stored calibration, and an earlier ``hydra-hf calibrate`` output.

    Raises:
        HydraInputError: a setting that does not apply or is out of range, one line naming the flag; every
            setting is checked here, before a model is loaded.
    """

    folder: str | os.PathLike
    data: str
    output: str | os.PathLike
    alpha: float = 0.1
    method: str = "lac"
    score: str | None = None
    risk: float | None = 0.1
    delta: float | None = None
    temperature: float | str | None = None
    penalty: float | None = None
    regularization_rank: int | None = None
    randomized: bool = False
    seed: int | None = None
    text_column: str = "text"
    label_column: str = "label"
    image_column: str | None = None
    max_samples: int | None = None
    batch_size: int = 32
    max_length: int = 128
    class_names: str | None = None
    templates: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.seed is not None and not self.randomized:
            raise HydraInputError(
                f"--seed {self.seed} seeds the randomised scores; add --randomized (aps or raps) or drop --seed"
            )
        check_alpha(self.alpha, "--alpha")
        if self.risk is None and self.delta is not None:
            raise HydraInputError(f"--delta {self.delta!r} is the confidence of the --risk guarantee, but --risk none "
                                  "fits no abstention threshold; drop --delta or give --risk")
        given = self.raps_flags()
        if given and self.method != "raps":
            flag, value = next(iter(given.items()))
            raise HydraInputError(f"{flag} {value!r} applies to --method raps, not {self.method}; drop it or pick "
                                  "--method raps")
        if self.risk is not None:
            check_alpha(self.risk, "--risk")
            check_alpha(self.settled("delta"), "--delta")
        check_settings(method=self.method, temperature=self.temperature, penalty=self.settled("penalty"),
                       regularization_rank=self.settled("regularization_rank"), randomized=self.randomized)

    def raps_flags(self) -> dict[str, Any]:
        """The RAPS flags given (``--raps-penalty``, ``--raps-rank``), by flag."""
        return {flag: value for flag, value in (("--raps-penalty", self.penalty),
                                                ("--raps-rank", self.regularization_rank)) if value is not None}

    def settled(self, name: str) -> Any:
        """``delta``, ``penalty`` or ``regularization_rank`` as given, else its default."""
        default = {"delta": DEFAULT_DELTA, "penalty": DEFAULT_PENALTY, "regularization_rank": DEFAULT_RANK}[name]
        value = getattr(self, name)
        return default if value is None else value


def calibrate(spec: CalibrateSpec) -> dict[str, Any]:
    """Copy ``spec.folder`` to ``spec.output`` with a calibration fitted on ``spec.data`` in its
    ``config.json``; returns the stored calibration.

    A causal LM folder gets :func:`~hydra_hf.calibration.generation.fit_generation_abstention` thresholds
    fitted on the texts of ``data`` (no labels; ``method``, ``risk``, ``delta`` and ``temperature`` do not
    apply). A two-tower (CLIP / SigLIP) folder classifies ``class_names`` (default: the sub-folders of an
    image folder ``data``) with the prompt ``templates`` (default: the zero-shot pipeline's ``"This is a
    photo of {}."``); both are stored, and its pipeline decides only for those classes and that one template.
    """
    folder, data, output, overwrite = spec.folder, spec.data, spec.output, spec.overwrite
    explicit = {flag: value for flag, value in (("--delta", spec.delta), *spec.raps_flags().items())
                if value is not None}
    delta, penalty, rank = spec.settled("delta"), spec.settled("penalty"), spec.settled("regularization_rank")
    settings = dict(alpha=spec.alpha, method=spec.method, risk=spec.risk, delta=delta, temperature=spec.temperature,
                    penalty=penalty, regularization_rank=rank, randomized=spec.randomized,
                    seed=0 if spec.seed is None else spec.seed)
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
    inputs = [Path(folder), *data_spec_paths(data), *zero_shot_paths(spec.class_names, spec.templates)]
    check_output(output, command="calibrate", overwrite=overwrite, inputs=inputs)  # before any work
    if is_causal_lm_folder(folder):
        given = spec.score or "mutual_information"
        score = resolve_score(given, "sequence").stored  # the spelling config.calibration holds
        if score not in GENERATION_SCORES:
            usable = [s.name for s in SEQUENCE_SCORES.values() if s.stored in GENERATION_SCORES]
            raise HydraInputError(f"--score {given!r} does not apply to a causal LM; use one of {', '.join(usable)}")
        if spec.temperature is not None or spec.randomized or explicit:
            flag = ("--temperature" if spec.temperature is not None else "--randomized" if spec.randomized
                    else next(iter(explicit)))
            raise HydraInputError(f"{flag} does not apply to a causal LM's abstention thresholds; drop it")
        lm, tokenizer = load_causal_lm(folder)
        dataset = resolve_dataset(data, text_column=spec.text_column, label_column=None, max_samples=spec.max_samples)
        if "text" not in dataset.column_names:
            raise HydraInputError(f"--data {data!r} has columns {dataset.column_names} and no texts; name them with "
                                  "--text-column")
        calibration = fit_generation_abstention(lm, tokenizer, list(dataset["text"]), alpha=spec.alpha, score=score,
                                                max_length=spec.max_length, batch_size=spec.batch_size)
        calibration.update({"data": data, "data_sha256": data_sha256(dataset)})
        _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
        return calibration
    score = spec.score or "msp"
    family = zero_shot_family(folder)
    if family is not None:
        names = zero_shot_class_names(spec.class_names, data, model=f"a {family.name} model")
        prompts = read_templates(spec.templates if spec.templates is not None else [ZERO_SHOT_TEMPLATE])
        dataset = resolve_dataset(data, text_column=spec.text_column, image_column=spec.image_column,
                                  label_column=spec.label_column, require_labels=True,
                                  label2id={n: i for i, n in enumerate(names)}, max_samples=spec.max_samples)
        dataset = zero_shot_data(dataset, names, f"--data {data!r}", f"a zero-shot {family.name} model")
        zero_shot = load_zero_shot_model(folder)
        loader = ev.make_loader(dataset, zero_shot.image_processor, "image", batch_size=spec.batch_size)
        predictions = ev.predict(zero_shot.predictor(names, prompts), loader, desc="calibration")
        calibration = fit_calibration(predictions.member_logits, predictions.labels, score=score, **settings)
        calibration.update({"class_names": names, "templates": prompts, "data": data,
                            "data_sha256": data_sha256(dataset), "hydra_hf_version": __version__})
        _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
        return calibration
    if spec.class_names is not None or spec.templates is not None:
        raise HydraInputError("--class-names / --templates apply to zero-shot CLIP / SigLIP folders; this folder is a "
                              "classifier with its own classes: drop them")
    model, preprocessor, modality = ev.load_classifier(folder)
    if isinstance(model, torch.nn.Module) and not hasattr(model.config, "num_members"):
        raise HydraInputError(f"{str(folder)!r} is not a Hydra Ensemble classifier")
    dataset = resolve_dataset(
        data, text_column=spec.text_column if modality == "text" else None, label_column=spec.label_column,
        image_column=spec.image_column if modality == "image" else None, label2id=model.config.label2id,
        num_labels=model.config.num_labels, require_labels=True, max_samples=spec.max_samples)
    predictions = ev.predict(
        ev.ModelPredictor(model),
        ev.make_loader(dataset, preprocessor, modality, batch_size=spec.batch_size, max_length=spec.max_length),
        desc="calibration",
    )
    calibration = fit_calibration(predictions.member_logits, predictions.labels, score=score, **settings)
    calibration.update({"data": data, "data_sha256": data_sha256(dataset), "hydra_hf_version": __version__})
    if "temperature_part" in calibration:
        calibration["n_total"] = int(predictions.labels.numel())

    _write_calibrated_copy(folder, output, calibration, overwrite, inputs)
    logger.info("calibrated %s -> %s: %s", folder, output, guarantee_text(calibration))
    return calibration


def calibrate_folder(folder: str | os.PathLike, data: str, output: str | os.PathLike, *, seed: int = 0,
                     randomized: bool = False, **options: Any) -> dict[str, Any]:
    """:func:`calibrate` with keyword options (``hydra_hf.calibrate_folder``): the options are
    :class:`CalibrateSpec`'s fields; ``seed`` only keys randomised scores."""
    return calibrate(CalibrateSpec(folder, data, output, randomized=randomized, seed=seed if randomized else None,
                                   **options))


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
