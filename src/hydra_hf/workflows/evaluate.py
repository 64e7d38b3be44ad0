"""``hydra-hf evaluate`` as one library call: :func:`evaluate` reads an :class:`EvaluateSpec` (the command's
options, typed) and writes report.json, report.md and the figures of a model folder and its baselines.

A classifier folder (text or image) is read with its own head. A CLIP / SigLIP folder (Hydra or stock;
open_clip folders as baselines) classifies zero-shot (:mod:`hydra_hf.evaluation.zero_shot`): its classes
are ``class_names`` or the sub-folders of an image folder given as ``id_data``, each embedded with the
``templates`` prompt ensemble. Both paths share the baselines' temperature scaling, the comparisons and
the report; a calibrated folder (``hydra-hf calibrate``) adds its decisions.

A causal LM folder with ``prompt`` classifies zero-shot (:mod:`hydra_hf.evaluation.zero_shot_lm`): every text
of the labelled ``id_data`` (and of the OOD sets) is read inside each prompt (a template holding ``{text}``, or a
JSON file of prompts; several are a prompt ensemble), and a member's class probabilities are its label words'
next-token probabilities renormalised over the classes (``label_words``, default the ``class_names``); the
report is the classifier path's. Baselines are causal LMs, read with the same prompts.

Without ``prompt``, a causal LM folder (a Hydra one from ``hydra-hf convert``, a stock ``*ForCausalLM`` /
``GPT2LMHeadModel``, or a GGUF checkpoint: a ``.gguf`` file or a folder holding one, read through its cached
plain folder; baselines causal LMs too) is evaluated with
:func:`hydra_hf.evaluation.causal_lm.evaluate_causal_lm` on the texts of ``id_data`` and of every
``ood_data`` set (no labels: the labels are the next tokens), each cut to ``max_length`` tokens. The
classifier-only options are refused.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import distributed
from ..calibration.fit import CONFIG_KEY as CALIBRATION_KEY
from ..calibration.report import DEFAULTS as DECISION_DEFAULTS
from ..calibration.report import decision_metrics, fit_for_report, render_decisions
from ..convert.gguf import checkpoint_inputs
from ..data import (
    check_data_spec,
    data_spec_paths,
    make_loader,
    parse_spec,
    read_class_names,
    read_templates,
    resolve_dataset,
    zero_shot_class_names,
    zero_shot_data,
    zero_shot_labels,
    zero_shot_paths,
)
from ..errors import HydraInputError
from ..evaluation import loading
from ..evaluation import predictors as pr
from ..evaluation.causal_lm import evaluate_causal_lm, write_causal_lm_report
from ..evaluation.plots import risk_coverage_figure
from ..evaluation.report import write_evaluation_report
from ..evaluation.run import EvaluationResult, compare_predictions, evaluate_predictors
from ..evaluation.zero_shot import check_same_images, load_zero_shot_model
from ..evaluation.zero_shot_lm import ZeroShotLMPredictor, make_text_batches
from ..families import is_causal_lm_folder
from ..metrics import OOD_SCORES, SEQUENCE_SCORES
from ..modeling.configuration_hydra import check_calibration
from ..outputs import check_output, read_json, write_output_folder
from ..prompting import TEXT_FIELD, parse_label_words, read_zero_shot_prompts

__all__ = ["DECISIONS_NOTE", "EvaluateSpec", "EvaluationSpec", "FolderEvaluation", "evaluate", "evaluate_folder"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluateSpec:
    """What ``hydra-hf evaluate`` evaluates; one field per option of the command (same names, same defaults).

    Attributes:
        model: the model folder (Hydra or any classifier, an ONNX export, a CLIP / SigLIP folder, a causal LM, a
            GGUF checkpoint).
        id_data: labelled in-distribution test data (file, folder or ``NAME:SPLIT``; a causal LM: any texts).
        ood_data: OOD data sets, each ``SPEC`` or ``NAME=SPEC``.
        report: the output folder (must not exist or be empty, unless ``overwrite``).
        name: the name of ``model`` in the report.
        baseline: other model folders (or GGUF checkpoints) to compare with, each ``NAME=DIR``.
        mc_dropout, mc_samples: MC Dropout of the models named, with this many samples.
        deep_ensemble, ensemble_size: Deep Ensembles (D) heads trained on this model's features (needs ``train_data``).
        temperature_scaling: a temperature-scaled copy of every model, fitted on ``val_data``.
        val_data, conformal_alpha: validation data; conformal sets and abstention fitted on it at each alpha.
        train_data: labelled training data for Deep Ensembles (D).
        text_column, label_column, image_column: the columns of tabular data.
        class_names, templates: zero-shot models' classes and prompt templates.
        prompt, label_words: a causal LM as a zero-shot classifier: its prompts (templates holding ``{text}`` or
            JSON files of prompts; several: a prompt ensemble) and the classes' label words
            (:func:`hydra_hf.prompting.parse_label_words`; default: the class names).
        score: the OOD score (:data:`hydra_hf.metrics.OOD_SCORES`; causal LMs:
            :data:`~hydra_hf.metrics.SEQUENCE_SCORES`).
        max_samples, batch_size, max_length: data cap; batch (None: 32, causal LMs 8); text truncation.
        compare, bootstrap: pairs ``A=B`` compared by a paired bootstrap with this many resamples (0: none).
        overwrite: replace ``report`` when it holds an earlier evaluation report.
        trust_remote_code: allow folders that ship their own code.

    Raises:
        ValueError: an option that needs another (``temperature_scaling`` without ``val_data`` ...), an alpha
            outside (0, 1), a baseline not written ``NAME=DIR``: one line naming the option and the fix. What
            needs the files (the folders exist, the data specs read) is checked by :func:`evaluate`, still
            before a model is loaded.
    """

    model: str
    id_data: str
    ood_data: list[str]
    report: str
    name: str = "Hydra"
    baseline: list[str] = field(default_factory=list)
    mc_dropout: list[str] = field(default_factory=list)
    mc_samples: int = 10
    deep_ensemble: str | None = None
    ensemble_size: int = 3
    temperature_scaling: bool = False
    val_data: str | None = None
    conformal_alpha: list[float] = field(default_factory=list)
    train_data: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    image_column: str | None = None
    class_names: str | None = None
    templates: str | None = None
    prompt: list[str] = field(default_factory=list)
    label_words: str | None = None
    score: str = "msp"
    max_samples: int | None = None
    batch_size: int | None = None
    max_length: int = 128
    compare: list[str] = field(default_factory=list)
    bootstrap: int = 1000
    overwrite: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.temperature_scaling and not self.val_data:
            raise ValueError("--temperature-scaling needs --val-data (a labelled validation split)")
        for alpha in self.conformal_alpha:
            if not 0 < alpha < 1:
                raise ValueError(f"--conformal-alpha {alpha!r} is outside (0, 1); e.g. 0.1: sets that hold the true "
                                 "label 90% of the time")
        if self.conformal_alpha and not self.val_data:
            raise ValueError(
                "--conformal-alpha needs --val-data (labelled data to fit the sets on, held out from the test data)"
            )
        if self.deep_ensemble and not self.train_data:
            raise ValueError("--deep-ensemble needs --train-data to train its classifier heads")
        self.models()

    def models(self) -> dict[str, str]:
        """``{name: folder}``: ``model`` under ``name``, then every baseline (``NAME=DIR``, names unique)."""
        models = {self.name: self.model}
        for baseline in self.baseline:
            name, path = _named(baseline, "")
            if not name:
                raise ValueError(f"--baseline {baseline!r}: write NAME=DIR, e.g. Single=runs/single")
            if name in models:
                raise ValueError(f"--baseline name {name!r} is used twice")
            models[name] = path
        return models


EvaluationSpec = EvaluateSpec  # its second name (hydra_hf.EvaluationSpec)


@dataclass
class FolderEvaluation:
    """What :func:`evaluate` wrote, and its numbers.

    Attributes:
        kind: ``"classifier"``, ``"zero_shot"``, ``"zero_shot_lm"`` (a causal LM with prompts) or ``"causal_lm"``.
        report: the report folder.
        score: the OOD score of the report.
        result: classifiers and zero-shot models: every row's metrics and predictions.
        causal_lm_reports: causal LMs: name -> the numbers of :func:`evaluate_causal_lm`.
    """

    kind: str
    report: Path
    score: str
    result: EvaluationResult | None = None
    causal_lm_reports: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Setup:
    """What either path (classifier, zero-shot) hands to the shared evaluation and report."""

    predictors: dict[str, Any]  # name -> hydra_hf.evaluation.Predictor
    id_loader: Iterable
    ood_loaders: Mapping[str, Iterable]
    val_loader: Iterable | None  # labelled validation data (--val-data), for temperature scaling
    settings: dict[str, Any] = field(default_factory=dict)  # added to the report's settings
    notes: str | None = None


def _named(spec: str, default_name: str) -> tuple[str, str]:
    if "=" in spec:
        name, _, path = spec.partition("=")
        return name.strip(), path.strip()
    return default_name, spec


def _check_models(spec: EvaluateSpec) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``({name: folder}, [(a, b) compared])`` from the options, checked before anything is loaded."""
    models = spec.models()
    for name, path in models.items():  # before any message that reads what kind of model a folder is
        if not os.path.exists(path):
            flag = "--model" if name == spec.name else f"--baseline {name}="
            raise FileNotFoundError(
                f"{flag}{'' if flag.endswith('=') else ' '}{path!r} does not exist; give a model folder "
                "(hydra-hf convert's output, a stock checkpoint or an ONNX export)"
            )
    for data in [spec.id_data, *spec.ood_data, spec.train_data, spec.val_data]:  # the data, before any model
        if data:
            check_data_spec(_named(data, "")[1])
    for name in spec.mc_dropout + ([spec.deep_ensemble] if spec.deep_ensemble else []):
        if name not in models:
            raise ValueError(f"{name!r} is not a model of this run; known: {sorted(models)}")
    if spec.bootstrap < 0 or 0 < spec.bootstrap < 10:
        raise ValueError(f"--bootstrap {spec.bootstrap}: use 0 (no intervals) or at least 10 resamples (e.g. 1000)")
    pairs = [_named(pair, "") for pair in spec.compare]
    if not spec.compare and len(models) > 1:
        pairs = [(spec.name, next(name for name in models if name != spec.name))]
    for a, b in pairs:
        if not a or not b:
            raise ValueError(f"--compare needs A=B with two model names, e.g. {spec.name}=Single")
    return models, pairs


def _inputs(spec: EvaluateSpec, models: dict[str, str]) -> list[str | Path]:
    """Every file and folder the evaluation reads (models, data, class names, templates, prompts): the report
    folder never holds one, so ``--overwrite`` never deletes what the run has just read."""
    data = [spec.id_data, *(_named(o, "")[1] for o in spec.ood_data), spec.val_data, spec.train_data]
    return [*(p for path in models.values() for p in checkpoint_inputs(path)),  # a GGUF's folder and cache too
            *(p for d in data for p in data_spec_paths(d)),
            *zero_shot_paths(spec.class_names, spec.templates),
            *(Path(p) for p in spec.prompt if TEXT_FIELD not in p and os.path.isfile(p))]  # prompt files


def _check_zero_shot_options(spec: EvaluateSpec, models: dict[str, str], family: str | None) -> None:
    """Zero-shot options only with a zero-shot --model, classifier options only with a classifier."""
    if family is None:
        if spec.class_names or spec.templates:
            raise ValueError(
                f"--class-names / --templates apply to zero-shot CLIP / SigLIP models; --model {spec.model!r} "
                "is a classifier with its own classes"
            )
        for name, path in models.items():
            other = loading.zero_shot_family(path)
            if other is not None:
                raise ValueError(f"--baseline {name} is a zero-shot {other.name} model but --model is a classifier; "
                                 "evaluate zero-shot models with a CLIP / SigLIP folder as --model")
        return
    if family == "open_clip":
        raise ValueError(f"--model {spec.model!r} is an open_clip folder: convert it (hydra-hf convert) or give it as "
                         "--baseline beside a CLIP folder, whose image processor reads the images")
    for flag, given in (("--mc-dropout", spec.mc_dropout), ("--deep-ensemble", spec.deep_ensemble)):
        if given:
            raise ValueError(f"{flag} does not apply to a zero-shot {family} model (no trained copies to ensemble, no "
                             "dropout it was trained with); use --temperature-scaling --val-data, or drop the option")
    for name, path in models.items():
        if name != spec.name and loading.zero_shot_family(path) is None:
            what = "does not exist" if not os.path.exists(path) else "is not a CLIP, SigLIP or open_clip folder"
            raise ValueError(f"--baseline {name}={path} {what}; a zero-shot --model ({family}) is compared with "
                             "zero-shot model folders only")


def _classifier_setup(spec: EvaluateSpec, models: dict[str, str]) -> _Setup:
    """Predictors and loaders of classifier folders (text or image), each with its own head."""
    if spec.deep_ensemble:
        loading.check_deep_ensemble_model(models[spec.deep_ensemble], spec.deep_ensemble)
    loaded = {
        name: loading.load_classifier(path, trust_remote_code=spec.trust_remote_code) for name, path in models.items()
    }
    modalities = {m for _, _, m in loaded.values()}
    if len(modalities) != 1:
        raise ValueError(f"models mix text and image inputs ({sorted(modalities)}); evaluate one modality at a time")
    _, preprocessor, modality = loaded[spec.name]
    cols = dict(text_column=spec.text_column if modality == "text" else None, label_column=spec.label_column,
                image_column=spec.image_column if modality == "image" else None)
    num_labels = loaded[spec.name][0].config.num_labels
    label2id = loaded[spec.name][0].config.label2id

    def data(source: str, labelled: bool):
        return resolve_dataset(source, **cols, require_labels=labelled, num_labels=num_labels if labelled else None,
                               label2id=label2id if labelled else None, max_samples=spec.max_samples)

    def loader(dataset):  # under `accelerate launch`, each process predicts one shard (gathered in order)
        return make_loader(dataset, preprocessor, modality, batch_size=spec.batch_size,
                                   max_length=spec.max_length, shard=True)

    id_loader = loader(data(spec.id_data, True))
    ood_loaders = {}
    for ood_spec in spec.ood_data:
        name, path = _named(ood_spec, parse_spec(ood_spec)[0])
        ood = data(path, False)
        ood_loaders[name] = loader(ood.remove_columns([c for c in ("label",) if c in ood.column_names]))

    predictors: dict[str, pr.Predictor] = {name: pr.ModelPredictor(model) for name, (model, _, _) in loaded.items()}
    for name in spec.mc_dropout:
        predictors[f"{name} + MC Dropout"] = pr.MCDropoutPredictor(loaded[name][0], samples=spec.mc_samples)
    if spec.deep_ensemble:
        heads = pr.train_ensemble_heads(loaded[spec.deep_ensemble][0], loader(data(spec.train_data, True)),
                                        num_heads=spec.ensemble_size)
        predictors["Deep Ensembles (D)"] = pr.HeadsEnsemblePredictor(loaded[spec.deep_ensemble][0], heads)
    wanted = spec.temperature_scaling or (spec.val_data and _wants_decisions(spec))
    val_loader = loader(data(spec.val_data, True)) if wanted else None
    return _Setup(predictors, id_loader, ood_loaders, val_loader)


def _zero_shot_setup(spec: EvaluateSpec, models: dict[str, str], family: str) -> _Setup:
    """Predictors and loaders of zero-shot models: every model classifies the same classes with the same
    prompt templates, on the images --model's image processor makes."""
    what = f"a zero-shot {family} model"
    names = zero_shot_class_names(spec.class_names, spec.id_data, model=f"a {family} model")
    templates = read_templates(spec.templates)
    if not spec.class_names:
        logger.info("class names from the image folder %r: %s", spec.id_data, ", ".join(names))
    label2id = {name: i for i, name in enumerate(names)}  # string labels name their class

    def data(flag: str, source: str, labelled: bool):
        dataset = resolve_dataset(source, text_column=spec.text_column, image_column=spec.image_column,
                                  label_column=spec.label_column if labelled else None, require_labels=labelled,
                                  label2id=label2id if labelled else None, max_samples=spec.max_samples)
        return zero_shot_data(dataset, names, f"{flag} {source!r}", what)

    # the data is read before the models: a bad data set fails at once
    id_data = data("--id-data", spec.id_data, True)
    wanted = spec.temperature_scaling or (spec.val_data and _wants_decisions(spec))
    val_data = data("--val-data", spec.val_data, True) if wanted else None
    oods = {}
    for ood_spec in spec.ood_data:
        name, path = _named(ood_spec, parse_spec(ood_spec)[0])
        oods[name] = data("--ood-data", path, False)
    loaded = {
        name: load_zero_shot_model(path, trust_remote_code=spec.trust_remote_code) for name, path in models.items()
    }
    reference = loaded[spec.name]
    for name, model in loaded.items():
        if name != spec.name:
            check_same_images(reference, model, name)

    def loader(dataset):  # under `accelerate launch`, each process predicts one shard (gathered in order)
        return make_loader(dataset, reference.image_processor, "image", batch_size=spec.batch_size, shard=True)

    predictors: dict[str, pr.Predictor] = {name: model.predictor(names, templates) for name, model in loaded.items()}
    shown = ", ".join(templates[:3]) + (", ..." if len(templates) > 3 else "")
    settings = {"class_names": names, "templates": f"{len(templates)} templates: {shown}"}
    notes = (
        f"Zero-shot: {len(names)} classes x {len(templates)} prompt templates (CLIP's prompt ensemble). A member's "
        "class probabilities are the softmax of its scaled image-prompt similarities (SigLIP too: its sigmoid "
        "scores are not a distribution over the classes, and its logit bias cancels). Latency: the class "
        "embeddings cached (the image tower only)."
    )
    return _Setup(predictors, loader(id_data), {name: loader(d) for name, d in oods.items()},
                  loader(val_data) if val_data is not None else None, settings, notes)


def _zero_shot_lm_setup(spec: EvaluateSpec, models: dict[str, str]) -> _Setup:
    """Predictors and loaders of causal LMs classifying zero-shot with ``spec.prompt``: every model reads the
    same prompts, each text cut to ``spec.max_length`` tokens inside them."""
    what = f"the causal LM --model {spec.model!r} classifying with --prompt"
    for flag, given in (("--templates", spec.templates), ("--mc-dropout", spec.mc_dropout),
                        ("--deep-ensemble", spec.deep_ensemble), ("--train-data", spec.train_data),
                        ("--image-column", spec.image_column)):
        if given:
            raise ValueError(f"{flag} does not apply to {what}; drop {flag}")
    for name, path in models.items():
        if name != spec.name and not is_causal_lm_folder(path):
            raise ValueError(f"--baseline {name}={path} is not a causal LM folder (...ForCausalLM); {what} is "
                             "compared with causal LMs reading the same prompts")
    words = parse_label_words(spec.label_words)
    names = read_class_names(spec.class_names) if spec.class_names else None
    prompts = read_zero_shot_prompts(spec.prompt, words or ([[n] for n in names] if names else None))
    names = names or [ws[0].strip() for ws in prompts[0].label_words]
    if len(names) != prompts[0].num_classes:
        raise ValueError(f"--class-names gives {len(names)} classes but the prompts' label words "
                         f"{prompts[0].num_classes}; give one name and one label word (or |-separated words) per "
                         "class, in label order")
    label2id = {name: i for i, name in enumerate(names)}

    def data(flag: str, source: str, labelled: bool):
        dataset = resolve_dataset(source, text_column=spec.text_column, label_column=spec.label_column if labelled
                                  else None, require_labels=labelled, label2id=label2id if labelled else None,
                                  max_samples=spec.max_samples)
        if "text" not in dataset.column_names:
            raise ValueError(f"{flag} {source!r} has columns {dataset.column_names} and no texts (--text-column)")
        return zero_shot_labels(dataset, names, f"{flag} {source!r}") if labelled else dataset

    # the data is read before the models: a bad data set fails at once
    id_data = data("--id-data", spec.id_data, True)
    wanted = spec.temperature_scaling or (spec.val_data and _wants_decisions(spec))
    val_data = data("--val-data", spec.val_data, True) if wanted else None
    oods = {}
    for ood_spec in spec.ood_data:
        name, path = _named(ood_spec, parse_spec(ood_spec)[0])
        oods[name] = data("--ood-data", path, False).select_columns(["text"])
    predictors: dict[str, pr.Predictor] = {}
    for name, path in models.items():
        model, tokenizer = loading.load_causal_lm(path, trust_remote_code=spec.trust_remote_code)
        predictors[name] = ZeroShotLMPredictor(model, tokenizer, prompts, max_text_tokens=spec.max_length)

    def loader(dataset):  # under `accelerate launch`, each process predicts one shard (gathered in order)
        return make_text_batches(dataset, spec.batch_size, shard=True)

    settings = {"class_names": names, "prompts": [dataclasses.asdict(p) for p in prompts],
                "max_text_tokens": spec.max_length}
    notes = (
        f"Zero-shot causal LM: {len(names)} classes x {len(prompts)} prompt(s). A member's class probabilities are "
        "its next-token probabilities of the classes' label words after the prompt (the first token of each word), "
        "renormalised over the classes; several prompts are averaged like members. Latency: the prompts' shared "
        "prefix cached."
    )
    return _Setup(predictors, loader(id_data), {name: loader(d) for name, d in oods.items()},
                  loader(val_data) if val_data is not None else None, settings, notes)


def _evaluate_causal_lm(spec: EvaluateSpec, models: dict[str, str]) -> FolderEvaluation:
    """A causal LM --model (and causal LM baselines): evaluate_causal_lm on the texts, one report."""
    info = distributed.process_info()
    what = f"the causal LM --model {spec.model!r}"
    for flag, given in (("--temperature-scaling", spec.temperature_scaling), ("--val-data", spec.val_data),
                        ("--mc-dropout", spec.mc_dropout), ("--deep-ensemble", spec.deep_ensemble),
                        ("--train-data", spec.train_data), ("--class-names", spec.class_names),
                        ("--label-words", spec.label_words), ("--templates", spec.templates),
                        ("--compare", spec.compare),
                        ("--conformal-alpha", spec.conformal_alpha),
                        ("--image-column", spec.image_column)):
        if given:
            raise ValueError(f"{flag} does not apply to {what} (a classifier option); drop {flag}, or classify "
                             "zero-shot with --prompt")
    if spec.score not in SEQUENCE_SCORES:
        raise ValueError(f"--score {spec.score!r} is not a sequence score of a causal LM; choose one of "
                         f"{', '.join(SEQUENCE_SCORES)}")
    if spec.max_length < 2:
        raise ValueError(
            f"--max-length {spec.max_length}: a causal LM needs at least 2 tokens per sequence; use e.g. 128"
        )
    for name, path in models.items():
        if name != spec.name and not is_causal_lm_folder(path):
            raise ValueError(
                f"--baseline {name}={path} is not a causal LM folder (...ForCausalLM); {what} is compared with causal "
                "LMs only"
            )
    check_output(spec.report, command="evaluate", overwrite=spec.overwrite, inputs=_inputs(spec, models))

    def texts(flag: str, source: str) -> list[str]:
        dataset = resolve_dataset(
            source, text_column=spec.text_column, label_column=None, max_samples=spec.max_samples
        )
        if "text" not in dataset.column_names:
            raise ValueError(
                f"{flag} {source!r} has columns {dataset.column_names} and no texts; give text data (--text-column)"
            )
        return list(dataset["text"])

    # the data is read before the models: a bad data set fails at once
    id_texts = texts("--id-data", spec.id_data)
    oods = {}
    for ood_spec in spec.ood_data:
        name, path = _named(ood_spec, parse_spec(ood_spec)[0])
        if name in oods or name == "id":
            raise ValueError(f"--ood-data name {name!r} is used twice (or is 'id'); name the sets, e.g. NAME={path}")
        oods[name] = texts("--ood-data", path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reports, params, compute = {}, {}, {}
    for name, path in models.items():
        model, tokenizer = loading.load_causal_lm(path, trust_remote_code=spec.trust_remote_code)
        model.to(device)
        reports[name] = evaluate_causal_lm(model, id_texts, oods, tokenizer=tokenizer, max_length=spec.max_length,
                                           batch_size=spec.batch_size, device=device)
        params[name] = sum(p.numel() for p in model.parameters())
        compute[name] = pr.model_compute_ratio(model)  # multiply-adds per token relative to the Single
        del model
    settings = {"task": "causal_lm", "id_data": spec.id_data, "ood_data": list(oods), "score": spec.score,
                "max_length": spec.max_length}
    if info.is_main:
        write_output_folder(spec.report, lambda tmp: write_causal_lm_report(reports, tmp, score=spec.score,
                                                                            settings=settings, params=params,
                                                                            compute=compute),
                            command="evaluate", overwrite=spec.overwrite, inputs=_inputs(spec, models))
    distributed.barrier()
    return FolderEvaluation("causal_lm", Path(spec.report), spec.score, causal_lm_reports=reports)


DECISIONS_NOTE = (
    "Calibrated decisions (split conformal sets and Learn-then-Test abstention, `hydra-hf calibrate`): per model "
    "and alpha, the empirical coverage of the sets and their mean size on the ID test data (95 % bootstrap intervals "
    "in brackets), the abstention score and threshold, the share answered and the accuracy among answered inputs, "
    "the AURC when ranking by that score, and per OOD set the share refused / given a set of more than one label / "
    "either. 'stored': the folder's own calibration; 'val': fitted on --val-data. "
    "risk_coverage.png: the risk-coverage curves."
)


def _stored_calibration(folder: str) -> dict[str, Any] | None:
    """The ``calibration`` that `hydra-hf calibrate` stored in ``folder``'s config.json (checked: one line naming
    the folder and the field when it is not what `hydra-hf calibrate` stores), or None."""
    file = Path(folder) / "config.json"
    if not file.is_file():
        return None
    config = read_json(file, what="model config", fix="pass a model folder with a valid config.json")
    if not isinstance(config, dict):
        return None
    labels = config.get("id2label")
    try:
        return check_calibration(config.get(CALIBRATION_KEY), len(labels) if isinstance(labels, dict) else None)
    except ValueError as exc:
        raise HydraInputError(f"--model {str(folder)!r}: {exc}") from None


def _wants_decisions(spec: EvaluateSpec) -> bool:
    return bool(spec.conformal_alpha) or _stored_calibration(spec.model) is not None


def _decisions(spec: EvaluateSpec, predictors: Mapping[str, Any], result: EvaluationResult, setup: _Setup
               ) -> dict[str, list[dict[str, Any]]] | None:
    """Every model's calibrated decisions on the test data: the --model folder's stored calibration, and
    calibrations fitted on --val-data (at every --conformal-alpha, else at the stored alpha) with the
    stored settings (else `hydra-hf calibrate`'s defaults). A zero-shot calibration of other classes or
    prompts than this evaluation's is not applied (its settings are)."""
    stored = _stored_calibration(spec.model)
    if stored is None and not spec.conformal_alpha:
        return None
    val_loader = setup.val_loader
    applies = stored is not None and (
        "class_names" not in stored
        or (
            stored["class_names"] == setup.settings.get("class_names")
            and stored.get("templates") == read_templates(spec.templates)
        )
    )
    if stored is not None and not applies:
        logger.warning(
            "the stored calibration of %s was fitted for the classes %s and templates %s, not this "
            "evaluation's: its decisions are not reported",
            spec.model,
            stored["class_names"],
            stored.get("templates"),
        )
    settings = {**DECISION_DEFAULTS, **{k: stored[k] for k in (*DECISION_DEFAULTS, "penalty", "regularization_rank")
                                        if stored is not None and stored.get(k) is not None}}
    alphas = list(dict.fromkeys(spec.conformal_alpha)) or ([stored["alpha"]] if stored else [])
    decisions: dict[str, list[dict[str, Any]]] = {}
    for k, (name, predictor) in enumerate(predictors.items()):
        preds = result.id_predictions[name]
        oods = {o: p.member_logits for o, p in result.ood_predictions[name].items()}
        records = [("stored", stored)] if applies and name == spec.name else []
        if val_loader is not None:
            val = pr.predict(predictor, val_loader, desc=f"{name}: calibration")
            records += [("val", fit_for_report(val.member_logits, val.labels, alpha, settings)) for alpha in alphas]
        decisions[name] = [{"source": source, **decision_metrics(record, preds.member_logits, preds.labels, oods,
                                                                 n_boot=spec.bootstrap, seed=10 * k)}
                           for source, record in records]
    return {name: rows for name, rows in decisions.items() if rows}


def evaluate(spec: EvaluateSpec) -> FolderEvaluation:
    """Evaluate ``spec.model`` (and its baselines) and write the report folder ``spec.report``.

    Every option is checked before a model is loaded, and the report folder is claimed before any work;
    a failed run leaves no report behind. Under ``accelerate launch`` every process predicts one shard of
    the data and the main process writes the report.

    Raises:
        ValueError / FileNotFoundError: one line naming the option and the fix.
    """
    info = distributed.process_info()
    models, pairs = _check_models(spec)
    causal_lm = is_causal_lm_folder(spec.model)  # folder_kind in two steps: the zero-shot test comes after --score
    if spec.batch_size is None:
        spec = dataclasses.replace(spec, batch_size=8 if causal_lm else 32)
    if causal_lm and not spec.prompt:
        return _evaluate_causal_lm(spec, models)
    if spec.prompt and not causal_lm:
        raise ValueError(f"--prompt classifies zero-shot with a causal LM, but --model {spec.model!r} is not one "
                         "(...ForCausalLM, or a GGUF checkpoint); drop --prompt")
    if spec.label_words and not spec.prompt:
        raise ValueError("--label-words names the answers of a --prompt; give the prompt too, or drop --label-words")
    if spec.score not in OOD_SCORES:
        raise ValueError(
            f"--score {spec.score!r} is for causal LMs; a classifier's OOD scores are {', '.join(OOD_SCORES)}"
        )
    _stored_calibration(spec.model)  # a calibration it would report is checked before any model loads
    found = None if causal_lm else loading.zero_shot_family(spec.model)  # None: a classifier (or its ONNX export)
    family = found.name if found is not None else None
    if not causal_lm:
        _check_zero_shot_options(spec, models, family)

    # claim the report folder before any work: no evaluation is lost to an unwritable --report
    check_output(spec.report, command="evaluate", overwrite=spec.overwrite, inputs=_inputs(spec, models))
    if causal_lm:
        setup = _zero_shot_lm_setup(spec, models)
    else:
        setup = _classifier_setup(spec, models) if family is None else _zero_shot_setup(spec, models, family)
    predictors = setup.predictors
    if spec.temperature_scaling:
        for name in list(predictors):
            t = pr.fit_temperature(pr.predict(predictors[name], setup.val_loader, desc=f"{name}: validation"))
            predictors[f"{name} + TS"] = pr.TemperatureScaledPredictor(predictors[name], t)
    unknown = [n for pair in pairs for n in pair if n not in predictors]
    if unknown:
        raise ValueError(
            f"--compare names {unknown[0]!r}, which this run does not evaluate; known: {sorted(predictors)}"
        )
    # None on a process whose shard is empty: only the main one reports latency
    first = next(iter(setup.id_loader), None)
    latency_batch = None if first is None else {k: v for k, v in first.items() if k != "labels"}
    result = evaluate_predictors(predictors, setup.id_loader, setup.ood_loaders, score=spec.score,
                                 latency_batch=latency_batch)
    settings = {"id_data": spec.id_data, "ood_data": list(setup.ood_loaders), "score": spec.score,
                "latency": f"median ms per batch of {spec.batch_size} on this machine", **setup.settings}
    if info.distributed:
        settings["processes"] = info.num_processes
    comparisons = {}
    if spec.bootstrap:
        for a, b in pairs:
            comparisons[f"{a} − {b}"] = compare_predictions(result, a, b, n_boot=spec.bootstrap)
    decisions = _decisions(spec, predictors, result, setup)
    notes, extra = setup.notes, None
    if decisions:
        extra = {"decisions": decisions}
        notes = ((notes + "\n\n") if notes else "") + DECISIONS_NOTE + "\n\n" + render_decisions(decisions)

    def write(tmp: Path) -> None:
        if decisions:
            risk_coverage_figure(decisions, tmp / "risk_coverage.png")
        write_evaluation_report(result, tmp, settings=settings, comparisons=comparisons, notes=notes, extra=extra)

    if info.is_main:  # every process holds the same metrics; one writes them
        write_output_folder(
            spec.report, write, command="evaluate", overwrite=spec.overwrite, inputs=_inputs(spec, models)
        )
    distributed.barrier()
    kind = "zero_shot_lm" if causal_lm else "zero_shot" if family is not None else "classifier"
    return FolderEvaluation(kind, Path(spec.report), spec.score, result)


evaluate_folder = evaluate  # its second name (hydra_hf.evaluate_folder)
