"""`hydra-hf evaluate`: calibration and OOD detection of a Hydra model and its baselines, written as
report.json, report.md, a reliability diagram and OOD-score histograms.

A classifier folder (text or image) is read with its own head. A CLIP / SigLIP folder (Hydra or stock;
open_clip folders as baselines) classifies zero-shot (:mod:`hydra_hf.evaluation.zero_shot`): its classes are
``--class-names`` or the sub-folders of an image folder given as ``--id-data``, each embedded with the
``--templates`` prompt ensemble. Both paths share the baselines' temperature scaling, the comparisons
and the report.

A causal LM folder (a Hydra one from ``hydra-hf convert``, or a stock ``*ForCausalLM`` /
``GPT2LMHeadModel``; baselines causal LMs too) is evaluated with
:func:`hydra_hf.evaluation.causal_lm.evaluate_causal_lm` on the texts of ``--id-data`` and of every
``--ood-data`` (no labels: the labels are the next tokens; ``--label-column`` is not read), each cut to
``--max-length`` tokens: report.json and report.md hold perplexity, NLL, next-token accuracy, ECE,
mutual information and per OOD set the AUROC / FPR95 of the sequence score ``--score`` (msp, entropy,
mutual_information or likelihood), with every score's AUROC below. The classifier-only options
(temperature scaling, MC Dropout, Deep Ensembles, zero-shot prompts, ``--compare``) are refused."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import finite_float
from .. import distributed, evaluation as ev
import torch

from ..calibration.fit import CONFIG_KEY as CALIBRATION_KEY
from ..calibration.report import DEFAULTS as DECISION_DEFAULTS
from ..calibration.report import decision_metrics, fit_for_report, render_decisions, risk_coverage_figure
from ..data import check_data_spec, parse_spec, resolve_dataset
from ..families import is_causal_lm_folder
from ..evaluation.causal_lm import evaluate_causal_lm, write_causal_lm_report
from ..evaluation.loading import load_causal_lm, zero_shot_family
from ..metrics import SEQUENCE_SCORES
from ..metrics import OOD_SCORES
from ..outputs import check_output, read_json, write_output_folder
from ..evaluation.report import render_markdown_table
from ..data import read_templates, zero_shot_class_names, zero_shot_data
from ..evaluation.zero_shot import check_same_images, load_zero_shot_model

logger = logging.getLogger(__name__)

# hydra_hf.data.TEMPLATE_SETS, named here: building the parser (every command does) imports no open_clip;
# tests/test_evaluate_zero_shot.py compares the two
TEMPLATE_SET_NAMES = ("openai", "simple", "default")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate calibration and OOD detection against baselines",
        description="Evaluate a model (and baselines) on labelled ID data and one or more OOD sets; write a "
        "report folder (report.json, report.md, reliability.png, ood_scores.png).",
    )
    p.add_argument("--model", required=True,
                   help="model folder to evaluate (Hydra or any classifier; a `hydra-hf export --format onnx` folder, or "
                   "a .onnx file in one, runs on ONNX Runtime; a CLIP / SigLIP folder classifies zero-shot: see "
                   "--class-names, --templates)")
    p.add_argument("--name", default="Hydra", help="name of --model in the report")
    p.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR",
                   help="another model folder (or ONNX export) to compare with (repeatable), e.g. Single=runs/single; "
                   "beside a zero-shot --model: a stock CLIP / SigLIP or open_clip folder")
    p.add_argument("--mc-dropout", action="append", default=[], metavar="NAME",
                   help="add MC Dropout of the model NAME (repeatable)")
    p.add_argument("--mc-samples", type=int, default=10, help="MC Dropout samples (default 10)")
    p.add_argument("--deep-ensemble", default=None, metavar="NAME",
                   help="add Deep Ensembles (D): 3 classifier heads trained on NAME's frozen features (needs --train-data; "
                   "NAME: a single stock classifier of any family)")
    p.add_argument("--ensemble-size", type=int, default=3, help="heads of Deep Ensembles (D) (default 3)")
    p.add_argument("--temperature-scaling", action="store_true",
                   help="add a temperature-scaled copy of every model, fitted on --val-data")
    p.add_argument("--id-data", required=True, help="labelled in-distribution test data (file, folder or NAME:SPLIT; "
                   "a causal LM: any texts)")
    p.add_argument("--ood-data", action="append", required=True, metavar="SPEC",
                   help="OOD data (repeatable); NAME=SPEC sets the name shown in the report")
    p.add_argument("--val-data", default=None,
                   help="labelled validation data for temperature scaling and for fitting --conformal-alpha sets")
    p.add_argument("--conformal-alpha", type=finite_float, action="append", default=[], metavar="ALPHA",
                   help="fit split conformal sets at level 1 - ALPHA and an abstention threshold on --val-data for every "
                   "model (repeatable), and report coverage, mean set size, selective accuracy, AURC and the OOD inputs "
                   "refused or given several labels; a folder calibrated by `hydra-hf calibrate` reports its stored "
                   "decisions without it (its baselines are fitted alike when --val-data is given)")
    p.add_argument("--train-data", default=None, help="labelled training data for Deep Ensembles (D) heads")
    p.add_argument("--text-column", default="text", help="column holding the text of csv/jsonl/parquet data (default: text)")
    p.add_argument("--label-column", default="label",
                   help="column holding the integer class (or class name) of labelled data (default: label)")
    p.add_argument("--image-column", default=None,
                   help="column holding images (or image paths) of tabular image data; image folders need none")
    p.add_argument("--class-names", default=None,
                   help="zero-shot models: the classes in label order, comma-separated or a file with one per line "
                   "(default with an image folder as --id-data: its sub-folders, matched by name)")
    p.add_argument("--templates", default=None, metavar="SET|FILE|TEMPLATE",
                   help=f"zero-shot models: the prompt templates of every class (CLIP's prompt ensemble): "
                   f"{' / '.join(TEMPLATE_SET_NAMES)}, a file with one template per line, or one template with {{}} "
                   "(default: 'a photo of a {}.')")
    p.add_argument("--score", default="msp", choices=[*OOD_SCORES, *(s for s in SEQUENCE_SCORES if s not in OOD_SCORES)],
                   help="OOD score (higher = more in-distribution; the paper uses msp): "
                   + "; ".join(f"{s.name}: {s.help}" for s in OOD_SCORES.values())
                   + "; causal LMs: the mean over a sequence's tokens of msp, entropy or mutual_information, or "
                   "likelihood (the mean token log-likelihood)")
    p.add_argument("--max-samples", type=int, default=None, help="cap every data set at this many examples")
    p.add_argument("--batch-size", type=int, default=None,
                   help="examples per forward pass; also the batch of the latency column (default 32; causal LMs 8: "
                   "their logits are B x M x T x V)")
    p.add_argument("--max-length", type=int, default=128, help="text: truncate inputs to this many tokens (default 128)")
    p.add_argument("--compare", action="append", default=[], metavar="A=B",
                   help="paired bootstrap interval of A minus B for accuracy, NLL, ECE, Brier and every OOD AUROC / "
                   "FPR95 (repeatable; default: --name against the first --baseline)")
    p.add_argument("--bootstrap", type=int, default=1000,
                   help="bootstrap resamples of --compare (default 1000; 0: no intervals)")
    p.add_argument("--report", required=True,
                   help="output folder for the report (must not exist or be empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --report if it holds an earlier `hydra-hf evaluate` report (never another folder)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow loading model folders that ship their own Python code (auto_map); off by default "
                   "because loading runs that code. Hydra folders never need it: hydra_hf loads them itself")
    p.set_defaults(func=run)


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


def _check_models(args: argparse.Namespace) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``({name: folder}, [(a, b) compared])`` from the options, checked before anything is loaded."""
    if args.temperature_scaling and not args.val_data:
        raise ValueError("--temperature-scaling needs --val-data (a labelled validation split)")
    for alpha in args.conformal_alpha:
        if not 0 < alpha < 1:
            raise ValueError(f"--conformal-alpha {alpha!r} is outside (0, 1); pass e.g. 0.1 for 90% sets")
    if args.conformal_alpha and not args.val_data:
        raise ValueError("--conformal-alpha needs --val-data (labelled data to fit the sets on, held out from the test data)")
    if args.deep_ensemble and not args.train_data:
        raise ValueError("--deep-ensemble needs --train-data to train its classifier heads")
    models = {args.name: args.model}
    for spec in args.baseline:
        name, path = _named(spec, "")
        if not name:
            raise ValueError(f"--baseline {spec!r}: write NAME=DIR, e.g. Single=runs/single")
        if name in models:
            raise ValueError(f"--baseline name {name!r} is used twice")
        models[name] = path
    for name, path in models.items():  # before any message that reads what kind of model a folder is
        if not os.path.exists(path):
            flag = "--model" if name == args.name else f"--baseline {name}="
            raise FileNotFoundError(f"{flag}{'' if flag.endswith('=') else ' '}{path!r} does not exist; give a model folder "
                                    "(hydra-hf convert's output, a stock checkpoint or an ONNX export)")
    for spec in [args.id_data, *args.ood_data, args.train_data, args.val_data]:  # the data, before any model
        if spec:
            check_data_spec(_named(spec, "")[1])
    for name in args.mc_dropout + ([args.deep_ensemble] if args.deep_ensemble else []):
        if name not in models:
            raise ValueError(f"{name!r} is not a model of this run; known: {sorted(models)}")
    if args.bootstrap < 0 or 0 < args.bootstrap < 10:
        raise ValueError(f"--bootstrap {args.bootstrap}: use 0 (no intervals) or at least 10 resamples (e.g. 1000)")
    pairs = [_named(spec, "") for spec in args.compare]
    if not args.compare and len(models) > 1:
        pairs = [(args.name, next(name for name in models if name != args.name))]
    for a, b in pairs:
        if not a or not b:
            raise ValueError(f"--compare needs A=B with two model names, e.g. {args.name}=Single")
    return models, pairs


def _check_zero_shot_options(args: argparse.Namespace, models: dict[str, str], family: str | None) -> None:
    """Zero-shot options only with a zero-shot --model, classifier options only with a classifier."""
    if family is None:
        if args.class_names or args.templates:
            raise ValueError(f"--class-names / --templates apply to zero-shot CLIP / SigLIP models; --model {args.model!r} "
                             "is a classifier with its own classes")
        for name, path in models.items():
            other = zero_shot_family(path)
            if other is not None:
                raise ValueError(f"--baseline {name} is a zero-shot {other.name} model but --model is a classifier; "
                                 "evaluate zero-shot models with a CLIP / SigLIP folder as --model")
        return
    if family == "open_clip":
        raise ValueError(f"--model {args.model!r} is an open_clip folder: convert it (hydra-hf convert) or give it as "
                         "--baseline beside a CLIP folder, whose image processor reads the images")
    for flag, given in (("--mc-dropout", args.mc_dropout), ("--deep-ensemble", args.deep_ensemble)):
        if given:
            raise ValueError(f"{flag} does not apply to a zero-shot {family} model (no trained copies to ensemble, no "
                             "dropout it was trained with); use --temperature-scaling --val-data, or drop the option")
    for name, path in models.items():
        if name != args.name and zero_shot_family(path) is None:
            what = "does not exist" if not os.path.exists(path) else "is not a CLIP, SigLIP or open_clip folder"
            raise ValueError(f"--baseline {name}={path} {what}; a zero-shot --model ({family}) is compared with "
                             "zero-shot model folders only")


def _classifier_setup(args: argparse.Namespace, models: dict[str, str]) -> _Setup:
    """Predictors and loaders of classifier folders (text or image), each with its own head."""
    if args.deep_ensemble:
        ev.check_deep_ensemble_model(models[args.deep_ensemble], args.deep_ensemble)
    loaded = {name: ev.load_classifier(path, trust_remote_code=args.trust_remote_code) for name, path in models.items()}
    modalities = {m for _, _, m in loaded.values()}
    if len(modalities) != 1:
        raise ValueError(f"models mix text and image inputs ({sorted(modalities)}); evaluate one modality at a time")
    _, preprocessor, modality = loaded[args.name]
    cols = dict(text_column=args.text_column if modality == "text" else None, label_column=args.label_column,
                image_column=args.image_column if modality == "image" else None)
    num_labels = loaded[args.name][0].config.num_labels
    label2id = loaded[args.name][0].config.label2id

    def data(spec: str, labelled: bool):
        return resolve_dataset(spec, **cols, require_labels=labelled, num_labels=num_labels if labelled else None,
                               label2id=label2id if labelled else None, max_samples=args.max_samples)

    def loader(dataset):  # under `accelerate launch`, each process predicts one shard (gathered in order)
        return ev.make_loader(dataset, preprocessor, modality, batch_size=args.batch_size, max_length=args.max_length,
                              shard=True)

    id_loader = loader(data(args.id_data, True))
    ood_loaders = {}
    for spec in args.ood_data:
        name, path = _named(spec, parse_spec(spec)[0])
        ood = data(path, False)
        ood_loaders[name] = loader(ood.remove_columns([c for c in ("label",) if c in ood.column_names]))

    predictors: dict[str, ev.Predictor] = {name: ev.ModelPredictor(model) for name, (model, _, _) in loaded.items()}
    for name in args.mc_dropout:
        predictors[f"{name} + MC Dropout"] = ev.MCDropoutPredictor(loaded[name][0], samples=args.mc_samples)
    if args.deep_ensemble:
        heads = ev.train_ensemble_heads(loaded[args.deep_ensemble][0], loader(data(args.train_data, True)),
                                        num_heads=args.ensemble_size)
        predictors["Deep Ensembles (D)"] = ev.HeadsEnsemblePredictor(loaded[args.deep_ensemble][0], heads)
    wanted = args.temperature_scaling or (args.val_data and _wants_decisions(args))
    val_loader = loader(data(args.val_data, True)) if wanted else None
    return _Setup(predictors, id_loader, ood_loaders, val_loader)


def _zero_shot_setup(args: argparse.Namespace, models: dict[str, str], family: str) -> _Setup:
    """Predictors and loaders of zero-shot models: every model classifies the same classes with the same
    prompt templates, on the images --model's image processor makes."""
    what = f"a zero-shot {family} model"
    names = zero_shot_class_names(args.class_names, args.id_data, model=f"a {family} model")
    templates = read_templates(args.templates)
    if not args.class_names:
        logger.info("class names from the image folder %r: %s", args.id_data, ", ".join(names))
    label2id = {name: i for i, name in enumerate(names)}  # string labels name their class

    def data(flag: str, spec: str, labelled: bool):
        dataset = resolve_dataset(spec, text_column=args.text_column, image_column=args.image_column,
                                  label_column=args.label_column if labelled else None, require_labels=labelled,
                                  label2id=label2id if labelled else None, max_samples=args.max_samples)  # fmt: skip
        return zero_shot_data(dataset, names, f"{flag} {spec!r}", what)

    # the data is read before the models: a bad data set fails at once
    id_data = data("--id-data", args.id_data, True)
    wanted = args.temperature_scaling or (args.val_data and _wants_decisions(args))
    val_data = data("--val-data", args.val_data, True) if wanted else None
    oods = {}
    for spec in args.ood_data:
        name, path = _named(spec, parse_spec(spec)[0])
        oods[name] = data("--ood-data", path, False)
    loaded = {name: load_zero_shot_model(path, trust_remote_code=args.trust_remote_code) for name, path in models.items()}
    reference = loaded[args.name]
    for name, model in loaded.items():
        if name != args.name:
            check_same_images(reference, model, name)

    def loader(dataset):  # under `accelerate launch`, each process predicts one shard (gathered in order)
        return ev.make_loader(dataset, reference.image_processor, "image", batch_size=args.batch_size, shard=True)

    predictors: dict[str, ev.Predictor] = {name: model.predictor(names, templates) for name, model in loaded.items()}
    shown = ", ".join(templates[:3]) + (", ..." if len(templates) > 3 else "")
    settings = {"class_names": names, "templates": f"{len(templates)} templates: {shown}"}
    notes = (f"Zero-shot: {len(names)} classes x {len(templates)} prompt templates (CLIP's prompt ensemble). A member's "
             "class probabilities are the softmax of its scaled image-prompt similarities (SigLIP too: its sigmoid "
             "scores are not a distribution over the classes, and its logit bias cancels). Latency: the class "
             "embeddings cached (the image tower only).")
    return _Setup(predictors, loader(id_data), {name: loader(d) for name, d in oods.items()},
                  loader(val_data) if val_data is not None else None, settings, notes)


def _run_causal_lm(args: argparse.Namespace, models: dict[str, str]) -> int:
    """A causal LM --model (and causal LM baselines): evaluate_causal_lm on the texts, one report."""
    info = distributed.process_info()
    what = f"the causal LM --model {args.model!r}"
    for flag, given in (("--temperature-scaling", args.temperature_scaling), ("--val-data", args.val_data),
                        ("--mc-dropout", args.mc_dropout), ("--deep-ensemble", args.deep_ensemble),
                        ("--train-data", args.train_data), ("--class-names", args.class_names),
                        ("--templates", args.templates), ("--compare", args.compare),
                        ("--conformal-alpha", args.conformal_alpha),
                        ("--image-column", args.image_column)):  # fmt: skip
        if given:
            raise ValueError(f"{flag} does not apply to {what} (a classifier option); drop {flag}")
    if args.score not in SEQUENCE_SCORES:
        raise ValueError(f"--score {args.score!r} is not a sequence score of a causal LM; choose one of "
                         f"{', '.join(SEQUENCE_SCORES)}")
    if args.max_length < 2:
        raise ValueError(f"--max-length {args.max_length}: a causal LM needs at least 2 tokens per sequence; use e.g. 128")
    for name, path in models.items():
        if name != args.name and not is_causal_lm_folder(path):
            raise ValueError(f"--baseline {name}={path} is not a causal LM folder (...ForCausalLM); {what} is compared "
                             "with causal LMs only")
    check_output(args.report, command="evaluate", overwrite=args.overwrite, inputs=list(models.values()))

    def texts(flag: str, spec: str) -> list[str]:
        dataset = resolve_dataset(spec, text_column=args.text_column, label_column=None, max_samples=args.max_samples)
        if "text" not in dataset.column_names:
            raise ValueError(f"{flag} {spec!r} has columns {dataset.column_names} and no texts; give text data (--text-column)")
        return list(dataset["text"])

    # the data is read before the models: a bad data set fails at once
    id_texts = texts("--id-data", args.id_data)
    oods = {}
    for spec in args.ood_data:
        name, path = _named(spec, parse_spec(spec)[0])
        if name in oods or name == "id":
            raise ValueError(f"--ood-data name {name!r} is used twice (or is 'id'); name the sets, e.g. NAME={path}")
        oods[name] = texts("--ood-data", path)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reports, params, compute = {}, {}, {}
    for name, path in models.items():
        model, tokenizer = load_causal_lm(path, trust_remote_code=args.trust_remote_code)
        model.to(device)
        reports[name] = evaluate_causal_lm(model, id_texts, oods, tokenizer=tokenizer, max_length=args.max_length,
                                           batch_size=args.batch_size, device=device)
        params[name] = sum(p.numel() for p in model.parameters())
        compute[name] = ev.model_compute_ratio(model)  # multiply-adds per token relative to the Single
        del model
    settings = {"task": "causal_lm", "id_data": args.id_data, "ood_data": list(oods), "score": args.score,
                "max_length": args.max_length}
    if info.is_main:
        write_output_folder(args.report, lambda tmp: write_causal_lm_report(reports, tmp, score=args.score,
                                                                            settings=settings, params=params,
                                                                            compute=compute),
                            command="evaluate", overwrite=args.overwrite, inputs=list(models.values()))
        for name, report in reports.items():
            print(f"{name}: perplexity {report['perplexity']:.4g}, next-token accuracy {report['accuracy']:.4f}, "
                  f"ECE {report['ece']:.4f}"
                  + "".join(f"; {o} AUROC ({args.score}) {e['scores'].get(args.score, {}).get('auroc', float('nan')):.4f}"
                            for o, e in report["ood"].items()))
        logger.info("report: %s", Path(args.report) / "report.md")
    distributed.barrier()
    return 0


DECISIONS_NOTE = (
    "Calibrated decisions (split conformal sets and Learn-then-Test abstention, `hydra-hf calibrate`): per model "
    "and alpha, the empirical coverage of the sets and their mean size on the ID test data (95 % bootstrap intervals "
    "in brackets), the abstention score and threshold, the share answered and the accuracy among answered inputs, "
    "the AURC when ranking by that score, and per OOD set the share refused / given a set of more than one label / "
    "either. 'stored': the folder's own calibration; 'val': fitted on --val-data. risk_coverage.png: the "
    "risk-coverage curves."
)


def _stored_calibration(folder: str) -> dict[str, Any] | None:
    """The ``calibration`` that `hydra-hf calibrate` stored in ``folder``'s config.json, or None."""
    file = Path(folder) / "config.json"
    if not file.is_file():
        return None
    config = read_json(file, what="model config", fix="pass a model folder with a valid config.json")
    stored = config.get(CALIBRATION_KEY) if isinstance(config, dict) else None
    return stored if isinstance(stored, dict) else None


def _wants_decisions(args: argparse.Namespace) -> bool:
    return bool(args.conformal_alpha) or _stored_calibration(args.model) is not None


def _decisions(args: argparse.Namespace, predictors: Mapping[str, Any], result: Any, setup: _Setup
               ) -> dict[str, list[dict[str, Any]]] | None:
    """Every model's calibrated decisions on the test data: the --model folder's stored calibration, and
    calibrations fitted on --val-data (at every --conformal-alpha, else at the stored alpha) with the
    stored settings (else `hydra-hf calibrate`'s defaults). A zero-shot calibration of other classes or
    prompts than this evaluation's is not applied (its settings are)."""
    stored = _stored_calibration(args.model)
    if stored is None and not args.conformal_alpha:
        return None
    val_loader = setup.val_loader
    applies = stored is not None and (
        "class_names" not in stored
        or (stored["class_names"] == setup.settings.get("class_names") and stored.get("templates") == read_templates(args.templates)))
    if stored is not None and not applies:
        logger.warning("the stored calibration of %s was fitted for the classes %s and templates %s, not this "
                       "evaluation's: its decisions are not reported", args.model, stored["class_names"], stored.get("templates"))
    settings = {**DECISION_DEFAULTS, **{k: stored[k] for k in (*DECISION_DEFAULTS, "penalty", "regularization_rank")
                                        if stored is not None and stored.get(k) is not None}}
    alphas = list(dict.fromkeys(args.conformal_alpha)) or ([stored["alpha"]] if stored else [])
    decisions: dict[str, list[dict[str, Any]]] = {}
    for k, (name, predictor) in enumerate(predictors.items()):
        preds = result.id_predictions[name]
        oods = {o: p.member_logits for o, p in result.ood_predictions[name].items()}
        records = [("stored", stored)] if applies and name == args.name else []
        if val_loader is not None:
            val = ev.predict(predictor, val_loader, desc=f"{name}: calibration")
            records += [("val", fit_for_report(val.member_logits, val.labels, alpha, settings)) for alpha in alphas]
        decisions[name] = [{"source": source, **decision_metrics(record, preds.member_logits, preds.labels, oods,
                                                                 n_boot=args.bootstrap, seed=10 * k)}
                           for source, record in records]
    return {name: rows for name, rows in decisions.items() if rows}


def run(args: argparse.Namespace) -> int:
    info = distributed.process_info()
    models, pairs = _check_models(args)
    causal_lm = is_causal_lm_folder(args.model)
    if args.batch_size is None:
        args.batch_size = 8 if causal_lm else 32
    if causal_lm:
        return _run_causal_lm(args, models)
    if args.score not in OOD_SCORES:
        raise ValueError(f"--score {args.score!r} is for causal LMs; a classifier's OOD scores are {', '.join(OOD_SCORES)}")
    found = zero_shot_family(args.model)  # None: a classifier (or an ONNX export of one)
    family = found.name if found is not None else None
    _check_zero_shot_options(args, models, family)

    # claim the report folder before any work: no evaluation is lost to an unwritable --report
    check_output(args.report, command="evaluate", overwrite=args.overwrite, inputs=list(models.values()))
    setup = _classifier_setup(args, models) if family is None else _zero_shot_setup(args, models, family)
    predictors = setup.predictors
    if args.temperature_scaling:
        for name in list(predictors):
            t = ev.fit_temperature(ev.predict(predictors[name], setup.val_loader, desc=f"{name}: validation"))
            predictors[f"{name} + TS"] = ev.TemperatureScaledPredictor(predictors[name], t)
    unknown = [n for pair in pairs for n in pair if n not in predictors]
    if unknown:
        raise ValueError(f"--compare names {unknown[0]!r}, which this run does not evaluate; known: {sorted(predictors)}")
    first = next(iter(setup.id_loader), None)  # None on a process whose shard is empty: only the main one reports latency
    latency_batch = None if first is None else {k: v for k, v in first.items() if k != "labels"}
    result = ev.evaluate_predictors(predictors, setup.id_loader, setup.ood_loaders, score=args.score,
                                    latency_batch=latency_batch)
    settings = {"id_data": args.id_data, "ood_data": list(setup.ood_loaders), "score": args.score,
                "latency": f"median ms per batch of {args.batch_size} on this machine", **setup.settings}
    if info.distributed:
        settings["processes"] = info.num_processes
    comparisons = {}
    if args.bootstrap:
        for a, b in pairs:
            comparisons[f"{a} − {b}"] = ev.compare_predictions(result, a, b, n_boot=args.bootstrap)
    decisions = _decisions(args, predictors, result, setup)
    notes, extra = setup.notes, None
    if decisions:
        extra = {"decisions": decisions}
        notes = ((notes + "\n\n") if notes else "") + DECISIONS_NOTE + "\n\n" + render_decisions(decisions)

    def write(tmp: Path) -> None:
        if decisions:
            risk_coverage_figure(decisions, tmp / "risk_coverage.png")
        ev.write_evaluation_report(result, tmp, settings=settings, comparisons=comparisons, notes=notes, extra=extra)

    if info.is_main:  # every process holds the same metrics; one writes them
        write_output_folder(args.report, write, command="evaluate", overwrite=args.overwrite, inputs=list(models.values()))

        print(render_markdown_table(result.rows))
        logger.info("report: %s", Path(args.report) / "report.md")
    distributed.barrier()
    return 0
