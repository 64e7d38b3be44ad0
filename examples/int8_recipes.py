"""The int8 recipes side by side on one Hydra folder (the table of docs/deploy.md).

For each recipe of ``hydra_hf.onnx.int8.INT8_RECIPES`` (``smoothquant``, the default; ``keep-fc2``; ``all``)
the script exports ``--model`` to ONNX with ``--quantize int8`` and that recipe, with the export's own
quantisation report: int8 against fp32 on the in-distribution validation split (the calibration data of the
recipes that calibrate) and on each OOD kind's validation split, at most ``--max-samples`` texts each, no test
data. It writes one results file (``--results``): per recipe the share of changed labels, the differences of
accuracy, ECE and every OOD AUROC (MSP and mutual information), the int8 products, the SmoothQuant alpha it
chose and the alphas it tried. The exports go to a temporary folder and are removed.

    python examples/int8_recipes.py --model outputs/demo/hydra --results docs/results/int8_recipes.json

``--model`` is a Hydra folder (``make demo`` writes ``outputs/demo/hydra``); nothing in it is changed.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from hydra_hf.cli import run_script
from hydra_hf.errors import HydraInputError
from hydra_hf.onnx.int8 import INT8_RECIPES
from hydra_hf.reproducibility import add_threads_argument, describe_threads, pin_threads, write_results_file
from hydra_hf.workflows.export import export_onnx

ID_DATA = "rotten_tomatoes:validation"
OOD_DATA = {
    "guardian": "guardian_headlines:ood_validation",
    "debates": "presidential_debates:ood_validation",
    "hamlet": "hamlet:ood_validation",
}


def recipe_numbers(export: Path) -> dict[str, Any]:
    """One recipe's row from its export folder: the quantisation report (its OOD sets by the names they were
    given) and the graph's int8 products."""
    report = json.loads((export / "quantization_report.json").read_text(encoding="utf-8"))
    meta = json.loads((export / "hydra_onnx.json").read_text(encoding="utf-8"))
    operators = meta["files"]["model_int8.onnx"]["quantized_operators"]
    diff = report["difference_int8_minus_fp32"]
    return {
        "labels_changed": 1.0 - report["label_agreement"],
        "accuracy": diff["accuracy"], "ece": diff["ece"], "nll": diff["nll"],
        "fp32_accuracy": report["models"]["fp32"]["accuracy"],
        "ood_auroc": diff["ood_auroc"],
        "matmul_integer": operators["MatMulInteger"],
        "alpha": operators.get("alpha"),
        "alphas_tried": operators.get("alphas_tried"),
        "num_examples": report["num_examples"],
    }


def compare(model: Path, recipes: list[str], max_samples: int, max_length: int) -> dict[str, Any]:
    if not (model / "config.json").is_file():
        raise HydraInputError(f"--model {str(model)!r} is not a Hydra folder (no config.json); run `make demo` "
                              "(it writes outputs/demo/hydra) or pass a folder `hydra-hf finetune` wrote")
    rows = {}
    with tempfile.TemporaryDirectory(prefix="int8-recipes-") as tmp:
        for recipe in recipes:
            logging.getLogger(__name__).info("recipe %s", recipe)
            export = export_onnx(model, Path(tmp) / recipe, quantize="int8", int8_recipe=recipe,
                                 calibration_data=ID_DATA, ood_data=[f"{k}={v}" for k, v in OOD_DATA.items()],
                                 data_options={"max_samples": max_samples, "max_length": max_length})
            rows[recipe] = recipe_numbers(export)
    return {"model": str(model), "id_data": ID_DATA, "ood_data": OOD_DATA, "max_samples": max_samples,
            "max_length": max_length, "recipes": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="outputs/demo/hydra", help="a Hydra folder (make demo writes this one)")
    parser.add_argument("--recipes", nargs="+", default=["smoothquant", "keep-fc2", "all"],
                        choices=sorted(INT8_RECIPES))
    parser.add_argument("--max-samples", type=int, default=500, help="texts per split (ID and each OOD kind)")
    parser.add_argument("--max-length", type=int, default=48, help="tokens per text (the demo's 48)")
    parser.add_argument("--results", default=None, help="write the results file here (docs/results/int8_recipes.json)")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    threads = pin_threads(args.threads)  # first, before any torch work
    print(describe_threads(threads))
    results = {"threads": threads, **compare(Path(args.model), args.recipes, args.max_samples, args.max_length)}
    text = write_results_file(results, args.results, __file__, argv)
    print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
