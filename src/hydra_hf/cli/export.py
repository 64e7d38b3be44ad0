"""`hydra-hf export`: a Hydra folder as one ONNX graph (ensemble and member logits, dynamic batch and
sequence axes), optionally int8-quantised with an accuracy report. A thin layer over
:func:`hydra_hf.onnx.export.export_onnx`; see docs/deploy.md."""

from __future__ import annotations

import argparse
import json
import logging

from ..errors import HydraInputError
from ..onnx import require_onnx
from ..onnx.export import export_onnx
from ..onnx.int8 import DEFAULT_RECIPE, INT8_RECIPES
from ..onnx.runtime import read_export_metadata
from . import positive_int

logger = logging.getLogger(__name__)

FORMATS = ("onnx",)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a Hydra folder for deployment (ONNX, optionally int8)",
        description="Export a Hydra Ensemble folder to one ONNX graph that returns the ensemble logits and every "
        "member's logits (dynamic batch and sequence axes, padded masks), with the config, the tokenizer / image "
        "processor and a README. With --quantize int8, also an ONNX Runtime int8 graph and a report of its accuracy, "
        "calibration and OOD detection against the fp32 graph on --calibration-data / --ood-data. Needs the onnx "
        "extra: pip install hydra-hf[onnx].",
    )
    p.add_argument(
        "model", metavar="DIR", help="the Hydra folder to export (written by `hydra-hf convert` or `finetune`)"
    )
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help=f"export format; supported: {', '.join(FORMATS)}")
    p.add_argument("--output", required=True,
                   help="output folder (must not exist or be empty, unless --overwrite)")
    p.add_argument("--opset", type=positive_int, default=18, help="ONNX opset of the graph (default 18, the minimum)")
    p.add_argument("--quantize", default=None, metavar="int8",
                   help="also write an int8 graph (ONNX Runtime dynamic quantisation of MatMul / Gemm weights), the "
                   "folder's default graph, and quantization_report.json / .md; needs --calibration-data")

    p.add_argument("--int8-recipe", default=None, choices=sorted(INT8_RECIPES), metavar="RECIPE",
                   help=f"int8: how the graph is quantised (default {DEFAULT_RECIPE}); "
                   + "; ".join(f"{name}: {r.help}" for name, r in INT8_RECIPES.items()))
    p.add_argument(
        "--quantize-all",
        action="store_true",
        help="int8: the same as --int8-recipe all (every constant weight per-tensor int8, fc2 unsmoothed; on "
        "the demo model it flipped 4x more labels than keep-fc2, docs/deploy.md)",
    )
    p.add_argument("--calibration-data", default=None, metavar="SPEC",
                   help="labelled in-distribution data for the quantisation report (file, folder or NAME:SPLIT, as "
                   "`hydra-hf evaluate --id-data` takes it), e.g. rotten_tomatoes:validation")
    p.add_argument("--ood-data", action="append", default=[], metavar="SPEC",
                   help="OOD data for the report's AUROC (repeatable); NAME=SPEC sets the name shown")
    p.add_argument(
        "--class-template",
        action="append",
        default=None,
        metavar="TEMPLATE",
        help="two-tower models (CLIP, SigLIP, open_clip): a prompt template of the report's zero-shot classifier, "
        "with {} for the class name (repeatable; default \"a photo of a {}.\"); the classes are "
        "--calibration-data's (an image folder with one sub-folder per class)",
    )
    p.add_argument(
        "--text-column", default="text", help="column holding the text of csv/jsonl/parquet data (default: text)"
    )
    p.add_argument("--label-column", default="label",
                   help="column holding the integer class (or class name) of labelled data (default: label)")
    p.add_argument("--image-column", default=None,
                   help="column holding images (or image paths) of tabular image data; image folders need none")
    p.add_argument("--max-samples", type=positive_int, default=None,
                   help="cap every report data set at this many examples")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="examples per forward pass of the report (default 32)")
    p.add_argument(
        "--max-length", type=positive_int, default=128,
        help="text: truncate report inputs to this many tokens (default 128)"
    )
    p.add_argument("--overwrite", action="store_true",
                   help="replace --output if it holds an earlier `hydra-hf export` output (never another folder)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format.lower() not in FORMATS:
        raise HydraInputError(f"--format {args.format!r} is not supported; use one of {list(FORMATS)}")
    if args.quantize is not None and args.quantize.lower() != "int8":
        raise HydraInputError(f"--quantize {args.quantize!r} is unknown; use int8")
    if (args.quantize_all or args.int8_recipe) and args.quantize is None:
        raise HydraInputError("--quantize-all / --int8-recipe change the int8 graph; pass --quantize int8 too")

    require_onnx("onnx", "onnxruntime", "onnxscript")  # before any work: a missing package is one line
    options = {"text_column": args.text_column, "label_column": args.label_column, "image_column": args.image_column,
               "max_samples": args.max_samples, "batch_size": args.batch_size, "max_length": args.max_length}
    out = export_onnx(args.model, args.output, opset=args.opset, quantize=args.quantize and args.quantize.lower(),
                      calibration_data=args.calibration_data, ood_data=args.ood_data, overwrite=args.overwrite,
                      data_options=options, **({"templates": args.class_template} if args.class_template else {}),
                      keep_mlp_output_fp32=False if args.quantize_all else None, int8_recipe=args.int8_recipe)

    metadata = read_export_metadata(out)
    print(json.dumps({"output": str(out), "files": sorted(metadata["files"]), "default_file": metadata["default_file"],
                      "opset": metadata["opset"], "max_abs_diff_fp32": metadata["verification"]["max_abs_diff_fp32"]}))
    return 0
