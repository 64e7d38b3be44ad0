"""`hydra-hf evaluate`: calibration and OOD detection of a model folder and its baselines, written as
report.json, report.md, a reliability diagram and OOD-score histograms. The options become an
:class:`~hydra_hf.workflows.evaluate.EvaluateSpec` and :func:`~hydra_hf.workflows.evaluate.evaluate` does the
work (classifiers, zero-shot CLIP / SigLIP folders and causal LMs; see its module)."""

from __future__ import annotations

import argparse
import dataclasses
import logging

from .. import distributed
from ..evaluation.report import render_markdown_table
from ..metrics import OOD_SCORES, SEQUENCE_SCORES, canonical_score_name
from ..workflows.evaluate import EvaluateSpec, evaluate
from . import finite_float, non_negative_int, positive_int

logger = logging.getLogger(__name__)

# hydra_hf.data.TEMPLATE_SETS, named here: building the parser (every command does) imports no open_clip;
# tests/evaluation/test_evaluate_zero_shot.py compares the two
TEMPLATE_SET_NAMES = ("openai", "simple", "default")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate calibration and OOD detection against baselines",
        description="Evaluate a model (and baselines) on labelled ID data and one or more OOD sets; write a "
        "report folder (report.json, report.md, reliability.png, ood_scores.png).",
    )
    p.add_argument(
        "--model",
        required=True,
        help="model folder to evaluate (Hydra or any classifier; a `hydra-hf export --format onnx` folder, or a "
        ".onnx file in one, runs on ONNX Runtime; a CLIP / SigLIP folder classifies zero-shot: see --class-names, "
        "--templates; a causal LM folder or a GGUF checkpoint, a .gguf file, is evaluated on next-token prediction, "
        "or classifies zero-shot with --prompt)",
    )
    p.add_argument("--name", default="Hydra", help="name of --model in the report")
    p.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR",
                   help="another model folder (or ONNX export, or GGUF checkpoint) to compare with (repeatable), e.g. "
                   "Single=runs/single; "
                   "beside a zero-shot --model: a stock CLIP / SigLIP or open_clip folder")
    p.add_argument("--mc-dropout", action="append", default=[], metavar="NAME",
                   help="add MC Dropout of the model NAME (repeatable)")
    p.add_argument("--mc-samples", type=positive_int, default=10, help="MC Dropout samples (default 10)")
    p.add_argument(
        "--deep-ensemble",
        default=None,
        metavar="NAME",
        help="add Deep Ensembles (D): 3 classifier heads trained on NAME's frozen features (needs --train-data; "
        "NAME: a single stock classifier of any family)",
    )
    p.add_argument("--ensemble-size", type=positive_int, default=3, help="heads of Deep Ensembles (D) (default 3)")
    p.add_argument("--temperature-scaling", action="store_true",
                   help="add a temperature-scaled copy of every model, fitted on --val-data")
    p.add_argument("--id-data", required=True, help="labelled in-distribution test data (file, folder or NAME:SPLIT; "
                   "a causal LM: any texts)")
    p.add_argument("--ood-data", action="append", required=True, metavar="SPEC",
                   help="OOD data (repeatable); NAME=SPEC sets the name shown in the report")
    p.add_argument("--val-data", default=None,
                   help="labelled validation data for temperature scaling and for fitting --conformal-alpha sets")
    p.add_argument(
        "--conformal-alpha",
        type=finite_float,
        action="append",
        default=[],
        metavar="ALPHA",
        help="fit split conformal sets at level 1 - ALPHA and an abstention threshold on --val-data for every "
        "model (repeatable), and report coverage, mean set size, selective accuracy, AURC and the OOD inputs "
        "refused or given several labels; a folder calibrated by `hydra-hf calibrate` reports its stored "
        "decisions without it (its baselines are fitted alike when --val-data is given)",
    )
    p.add_argument("--train-data", default=None, help="labelled training data for Deep Ensembles (D) heads")
    p.add_argument(
        "--text-column", default="text", help="column holding the text of csv/jsonl/parquet data (default: text)"
    )
    p.add_argument("--label-column", default="label",
                   help="column holding the integer class (or class name) of labelled data (default: label)")
    p.add_argument("--image-column", default=None,
                   help="column holding images (or image paths) of tabular image data; image folders need none")
    p.add_argument("--class-names", default=None,
                   help="zero-shot models (CLIP / SigLIP, or a causal LM with --prompt): the classes in label order, "
                   "comma-separated or a file with one per line (default with an image folder as --id-data: its "
                   "sub-folders, matched by name)")
    p.add_argument("--prompt", action="append", default=[], metavar="TEMPLATE|FILE",
                   help="a causal LM classifies zero-shot: a user message holding {text} (where each text goes; \\n "
                   "for a newline; the tokenizer's chat template renders it), or a JSON file of prompts (an object or "
                   "a list: template, label_words, system, answer_prefix, name); repeatable: a prompt ensemble. A "
                   "class's probability is its label words' next-token probability, renormalised over the classes")
    p.add_argument("--label-words", default=None, metavar="WORDS",
                   help="--prompt: each class's label word, comma-separated in label order, alternatives with | (e.g. "
                   "'negative|bad,positive|good'; default: --class-names); the first token of each word is read")
    p.add_argument("--templates", default=None, metavar="SET|FILE|TEMPLATE",
                   help=f"zero-shot models: the prompt templates of every class (CLIP's prompt ensemble): "
                   f"{' / '.join(TEMPLATE_SET_NAMES)}, a file with one template per line, or one template with {{}} "
                   "(default: 'a photo of a {}.')")
    p.add_argument(
        "--score",
        default="msp",
        type=canonical_score_name,  # an older spelling (mi) is read, with a deprecation line
        choices=[*OOD_SCORES, *(s for s in SEQUENCE_SCORES if s not in OOD_SCORES)],
        help="OOD score (higher = more in-distribution; the paper uses msp): "
        + "; ".join(f"{s.name}: {s.help}" for s in OOD_SCORES.values())
        + "; causal LMs: the mean over a sequence's tokens of msp, entropy or mutual_information, or "
        "likelihood (the mean token log-likelihood)",
    )
    p.add_argument("--max-samples", type=positive_int, default=None, help="cap every data set at this many examples")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="examples per forward pass; also the batch of the latency column (default 32; causal LMs 8: "
                   "their logits are B x M x T x V)")
    p.add_argument(
        "--max-length", type=positive_int, default=128, help="text: truncate inputs to this many tokens (default 128)"
    )
    p.add_argument("--compare", action="append", default=[], metavar="A=B",
                   help="paired bootstrap interval of A minus B for accuracy, NLL, ECE, Brier and every OOD AUROC / "
                   "FPR95 (repeatable; default: --name against the first --baseline)")
    p.add_argument("--bootstrap", type=non_negative_int, default=1000,
                   help="bootstrap resamples of --compare (default 1000; 0: no intervals)")
    p.add_argument("--report", required=True,
                   help="output folder for the report (must not exist or be empty, unless --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace --report if it holds an earlier `hydra-hf evaluate` report (never another folder)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow loading model folders that ship their own Python code (auto_map); off by default "
                   "because loading runs that code. Hydra folders never need it: hydra_hf loads them itself")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = EvaluateSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EvaluateSpec)})
    done = evaluate(spec)
    if not distributed.process_info().is_main:
        return 0
    for name, report in done.causal_lm_reports.items():
        print(f"{name}: perplexity {report['perplexity']:.4g}, next-token accuracy {report['accuracy']:.4f}, "
              f"ECE {report['ece']:.4f}"
              + "".join(f"; {o} AUROC ({done.score}) {e['scores'].get(done.score, {}).get('auroc', float('nan')):.4f}"
                        for o, e in report["ood"].items()))
    if done.result is not None:
        print(render_markdown_table(done.result.rows))
    logger.info("report: %s", done.report / "report.md")
    return 0
