"""Aggregate several seeds of the main job: mean ± std of every row and of every paired difference.

Each input is a results file `examples/demo.py --seed S --results FILE` wrote (make demo writes seed 0's,
docs/results/demo.json). The seeds must be runs of one pipeline (the same methods, settings and models); the
output holds, per paired comparison of the runs (Hydra − Single, Hydra − Deep Ensemble), the mean and sample
standard deviation over the seeds of each seed's difference, how many seeds' paired bootstrap intervals said
better / tie / worse, each seed's difference, and a paired t-test over the seeds (whether the seeds decide the
sign of the mean difference at the 5 % level). `make docs` renders docs/results.md's three-seed table from it.

    python examples/demo.py --seed 1 --output outputs/demo-seed1 --results docs/results/demo_seed1.json
    python examples/demo.py --seed 2 --output outputs/demo-seed2 --results docs/results/demo_seed2.json
    python examples/demo_seeds.py docs/results/demo.json docs/results/demo_seed1.json \
        docs/results/demo_seed2.json --results docs/results/demo_seeds.json
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra_hf.cli import run_script
from hydra_hf.errors import HydraInputError
from hydra_hf.evaluation.report import aggregate_seed_reports, check_seed_report, summarize_seed_comparisons
from hydra_hf.metrics import paired_t_over_seeds
from hydra_hf.outputs import read_json
from hydra_hf.reproducibility import write_results_file

LEVEL = 0.05
"""Significance level of the paired t-test over seeds."""


def read_run(path: Path) -> dict[str, Any]:
    """One seed's results file of examples/demo.py: its report (checked) and the seed it ran with."""
    data = read_json(path, what="demo results file",
                     fix="pass the file `python examples/demo.py --results FILE` wrote, unedited")
    if not isinstance(data, Mapping) or not isinstance(data.get("report"), Mapping):
        raise HydraInputError(f"{str(path)!r} holds no 'report': pass the file `python examples/demo.py --results "
                              "FILE` wrote")
    report = check_seed_report(data["report"], repr(str(path)))
    seed = (report.get("settings") or {}).get("seed")
    return {"file": str(path), "seed": seed, "command": data.get("command"), "report": report}


def aggregate_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The seeds' aggregate: mean ± std rows, and per comparison and metric the seeds' differences, their
    summary (mean, std, the seeds' bootstrap verdicts) and the t-test over seeds (``t_test_p``, ``decided``)."""
    if len(runs) < 2:
        raise HydraInputError(f"pass the results files of at least 2 seeds, got {len(runs)}")
    seeds = [run["seed"] for run in runs]
    if len(set(map(str, seeds))) != len(seeds):
        raise HydraInputError(f"the results files were run with the seeds {seeds}: pass one file per seed")
    reports = [run["report"] for run in runs]
    try:
        aggregate = aggregate_seed_reports(reports)
        summary = summarize_seed_comparisons(reports)
    except ValueError as exc:
        raise HydraInputError(str(exc)) from None
    comparisons: dict[str, dict[str, Any]] = {}
    for name, metrics in summary.items():
        for metric, row in metrics.items():
            differences = [float(report["comparisons"][name][metric]["difference"]) for report in reports]
            test = paired_t_over_seeds(differences, LEVEL)
            comparisons.setdefault(name, {})[metric] = {**row, "differences": differences, "t_test_p": test["p"],
                                                        "decided": test["decided"]}
    return {"seeds": seeds, "files": [run["file"] for run in runs], "commands": [run["command"] for run in runs],
            "level": LEVEL, "aggregate": aggregate, "comparisons": comparisons}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", metavar="RESULTS",
                        help="results files of examples/demo.py, one per seed (docs/results/demo.json is seed 0's)")
    parser.add_argument("--results", default=None, help="write the aggregate here (docs/results/demo_seeds.json)")
    args = parser.parse_args(argv)
    paths = [Path(f) for f in args.files]
    for j, path in enumerate(paths):
        if path.resolve() in [p.resolve() for p in paths[:j]]:
            raise HydraInputError(f"{args.files[j]!r} is given twice; pass one results file per seed")
    results = aggregate_runs([read_run(path) for path in paths])
    write_results_file(results, args.results, __file__, argv)
    for name, metrics in results["comparisons"].items():
        print(name)
        for metric, row in metrics.items():
            if math.isfinite(row["mean"]):
                print(f"  {metric:16s} {row['mean']:+.4f} ± {row['std']:.4f}  p = {row['t_test_p']:.3f}  "
                      f"{row['better']} / {row['tie']} / {row['worse']}")
    return 0


if __name__ == "__main__":
    run_script(main)
