"""`hydra-hf calibrate`: a copy of a Hydra classifier folder that carries calibrated decisions.

Fits, on labelled calibration data exchangeable with the data the model will see, split conformal
prediction sets at level 1 - ``--alpha`` and a threshold on an uncertainty score above which the model
abstains, certified to keep the error among answered inputs at most ``--risk`` with confidence
1 - ``--delta`` (Learn then Test). Both go into the new folder's ``config.json`` under ``calibration``;
its pipelines then add ``prediction_set`` and ``abstain`` to every result. One call of
:func:`hydra_hf.calibration.calibrate_folder`.
"""

from __future__ import annotations

import argparse
import json

from ..calibration import calibrate_folder, guarantee_text
from ..calibration.conformal import CONFORMAL_METHODS
from ..metrics import OOD_SCORES, canonical_score_name
from . import finite_float, non_negative_int, positive_int


def _risk(value: str) -> float | None:
    if value.strip().lower() == "none":
        return None
    try:
        return finite_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a finite number in (0, 1) or 'none'") from None


def _temperature(value: str) -> float | str:
    if value.strip().lower() == "fit":
        return "fit"
    try:
        return finite_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a finite number (a positive temperature) or 'fit'"
        ) from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit conformal prediction sets and a risk-controlled abstention threshold into a copy of a folder",
        description="Copy a Hydra classifier folder (text or image) to --output with calibrated decisions in its "
        "config.json: split conformal prediction sets at level 1 - alpha and an abstention threshold that keeps the "
        "error among answered inputs at most --risk with confidence 1 - --delta (Learn then "
        "Test). The input folder is never changed.",
    )
    p.add_argument("folder", help="the Hydra classifier folder to calibrate (left unchanged)")
    p.add_argument(
        "--data",
        required=True,
        help="labelled calibration data (file, folder or NAME:SPLIT), held out from training and exchangeable "
        "with the data the model will see",
    )
    p.add_argument("--output", required=True, help="the new, calibrated folder (must not exist or be empty)")
    p.add_argument("--alpha", type=finite_float, default=0.1,
                   help="miscoverage of the prediction sets, in (0, 1): the sets hold the label with "
                   "probability >= 1 - alpha (default 0.1)")
    p.add_argument("--method", choices=CONFORMAL_METHODS, default="lac",
                   help="conformal score: lac (1 - p_y), aps (adaptive sets), raps (regularised APS); deterministic, "
                   "no random tie-breaking, unless --randomized (default lac)")
    p.add_argument(
        "--randomized",
        action="store_true",
        help="aps / raps: randomised scores (Romano et al. 2020), whose coverage is close to 1 - alpha instead "
        "of above it (deterministic APS covers far more with two classes); an input's uniform U is a hash "
        "of --seed and its probabilities: the same input always gets the same set (default: deterministic)",
    )
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="with --randomized: the seed of the scores' U, stored in the calibration (default 0)")
    p.add_argument("--raps-penalty", type=finite_float, default=None, help="--method raps: its lambda (default 0.1)")
    p.add_argument("--raps-rank", type=non_negative_int, default=None,
                   help="--method raps: its k_reg, ranks above it are penalised (default 1)")
    p.add_argument("--score", type=canonical_score_name, choices=[s.name for s in OOD_SCORES.values() if s.stored],
                   default=None,
                   help="the score whose uncertainty decides abstention, as evaluate --score names it: msp (1 - max "
                   "probability), entropy, mutual_information (the members' disagreement; mi, its old spelling, is "
                   "read too) (default msp; a causal LM folder: mutual_information, or entropy, with thresholds on "
                   "the tokens and the sequences of unlabelled --data texts for generate_with_uncertainty)")
    p.add_argument(
        "--risk",
        type=_risk,
        default=0.1,
        help="error rate among answered inputs to certify, in (0, 1); 'none' fits the sets only (default 0.1)",
    )
    p.add_argument("--delta", type=finite_float, default=None,
                   help="with --risk: the risk holds with probability >= 1 - delta over the calibration draw "
                   "(default 0.1)")
    p.add_argument("--temperature", type=_temperature, default=None, metavar="T|fit",
                   help="divide the member logits by T before everything; 'fit' fits T (NLL) on a seeded random half "
                   "of --data and calibrates on the other half (default: none)")
    p.add_argument("--text-column", default="text", help="column holding the text (default: text)")
    p.add_argument("--label-column", default="label", help="column holding the class id or name (default: label)")
    p.add_argument("--image-column", default=None, help="column holding images (or paths) of tabular image data")
    p.add_argument(
        "--class-names",
        default=None,
        help="zero-shot CLIP / SigLIP folders: the classes in label order, comma-separated or a file with one "
        "per line (default with an image folder as --data: its sub-folders)",
    )
    p.add_argument(
        "--templates",
        default=None,
        metavar="SET|FILE|TEMPLATE",
        help="zero-shot folders: the prompt templates (default: the pipeline's 'This is a photo of {}.'; the "
        "pipeline decides only for one template, the one it is called with)",
    )
    p.add_argument("--max-samples", type=positive_int, default=None, help="use the first N examples of --data")
    p.add_argument("--batch-size", type=positive_int, default=32, help="examples per forward pass (default 32)")
    p.add_argument(
        "--max-length", type=positive_int, default=128, help="text: truncate inputs to this many tokens (default 128)"
    )
    p.add_argument("--overwrite", action="store_true",
                   help="replace the folder's existing calibration, and an earlier `hydra-hf calibrate` --output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.seed is not None and not args.randomized:
        raise ValueError(
            f"--seed {args.seed} seeds the randomised scores; add --randomized (aps or raps) or drop --seed"
        )
    calibration = calibrate_folder(
        args.folder, args.data, args.output, alpha=args.alpha, method=args.method, score=args.score, risk=args.risk,
        delta=args.delta, temperature=args.temperature, penalty=args.raps_penalty, regularization_rank=args.raps_rank,
        randomized=args.randomized, seed=0 if args.seed is None else args.seed,
        text_column=args.text_column, label_column=args.label_column, image_column=args.image_column,
        max_samples=args.max_samples, batch_size=args.batch_size, max_length=args.max_length,
        class_names=args.class_names, templates=args.templates, overwrite=args.overwrite,
    )
    print(guarantee_text(calibration))
    keys = (
        "method",
        "randomized",
        "alpha",
        "q_hat",
        "n",
        "score",
        "risk",
        "threshold",
        "token_threshold",
        "sequence_threshold",
    )
    print(json.dumps({k: calibration[k] for k in keys if k in calibration}))
    return 0
