"""How far apart two runs of the main job are: per method, the differences of accuracy, ECE and every AUROC,
how many of the report's numbers are identical, the CPUs they ran on, and the training stages' time ratio.

The main job trains in bf16 where the CPU multiplies bf16 natively; this script measures what that choice
moves, against an fp32-trained run of the same seed (docs/results.md renders the sentence from its file):

    python examples/demo.py --mixed-precision no --output outputs/demo-fp32 --results docs/results/demo_fp32.json
    python examples/compare_demo_runs.py docs/results/demo.json docs/results/demo_fp32.json \
        --results docs/results/demo_precision.json

Two runs of one seed on two CPUs (`docs/results.md` renders view run-agreement from such a file):

    python examples/compare_demo_runs.py OTHER_CPU.json docs/results/demo.json --results docs/results/demo_cpus.json

Both runs must list the same methods with the same seed; the rows that train nothing (the int8 graph's
export, temperature scaling) are compared like the others.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra_hf.cli import run_script
from hydra_hf.errors import HydraInputError
from hydra_hf.outputs import read_json
from hydra_hf.reproducibility import write_results_file

TRAINING_STAGES = ("fine-tune",)
"""The stages whose names hold one of these words train (their time ratio is the training speed-up)."""


def read_run(path: Path) -> dict[str, Any]:
    data = read_json(path, what="demo results file",
                     fix="pass the file `python examples/demo.py --results FILE` wrote, unedited")
    report = data.get("report") if isinstance(data, Mapping) else None
    if not isinstance(report, Mapping) or not isinstance(report.get("rows"), list) or \
            not isinstance(data.get("timings_s"), Mapping):
        raise HydraInputError(f"{str(path)!r} holds no report rows and stage timings: pass the file "
                              "`python examples/demo.py --results FILE` wrote")
    return data


def _ood_sets(row: Mapping[str, Any]) -> list[str]:
    return [key for key, value in row.items() if isinstance(value, Mapping) and "auroc" in value]


def _numbers(value: Any, path: str = "") -> dict[str, float]:
    """Every number of a report row, by its path; latency left out (it is a timing, not a result)."""
    if isinstance(value, Mapping):
        return {k: v for key, item in value.items() if "latency" not in key
                for k, v in _numbers(item, f"{path}.{key}").items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {path: float(value)}
    return {}


def compare_runs(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Per method, B minus A of accuracy, ECE and each AUROC; the largest absolute differences over the methods;
    how many of the numbers both reports hold (latency aside) are identical; the CPUs each run recorded; the
    training stages' seconds of each run and B's time over A's."""
    rows_a, rows_b = a["report"]["rows"], b["report"]["rows"]
    methods = [row["method"] for row in rows_a]
    if methods != [row["method"] for row in rows_b]:
        raise HydraInputError(f"the runs list different methods ({methods} and {[r['method'] for r in rows_b]}); "
                              "compare two runs of one pipeline")
    seeds = [run["report"].get("settings", {}).get("seed") for run in (a, b)]
    if seeds[0] != seeds[1]:
        raise HydraInputError(f"the runs used the seeds {seeds}: compare two runs of one seed")
    rows = []
    for row_a, row_b in zip(rows_a, rows_b):
        diff = {"method": row_a["method"], "accuracy": row_b["accuracy"] - row_a["accuracy"],
                "ece": row_b["ece"] - row_a["ece"]}
        diff["auroc"] = {k: row_b[k]["auroc"] - row_a[k]["auroc"] for k in _ood_sets(row_a)}
        rows.append(diff)
    numbers = [(_numbers(row_a), _numbers(row_b)) for row_a, row_b in zip(rows_a, rows_b)]
    shared = [(x[key], y[key]) for x, y in numbers for key in x.keys() & y.keys()]
    stages = [name for name in a["timings_s"] if any(word in name for word in TRAINING_STAGES)]
    seconds_a = sum(a["timings_s"][name] for name in stages)
    seconds_b = sum(b["timings_s"].get(name, 0.0) for name in stages)
    return {
        "precisions": [a.get("mixed_precision"), b.get("mixed_precision")],
        "machines": [a.get("machine"), b.get("machine")],
        "numbers": len(shared),
        "identical": sum(x == y for x, y in shared),
        "commands": [a.get("command"), b.get("command")],
        "seed": seeds[0],
        "rows": rows,
        "max_abs_accuracy": max(abs(r["accuracy"]) for r in rows),
        "max_abs_ece": max(abs(r["ece"]) for r in rows),
        "max_abs_auroc": max((abs(v) for r in rows for v in r["auroc"].values()), default=0.0),
        "training_stages": stages,
        "training_s": [seconds_a, seconds_b],
        "training_ratio": seconds_b / seconds_a if seconds_a > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", metavar="RUN_A", help="a results file of examples/demo.py (docs/results/demo.json)")
    parser.add_argument("b", metavar="RUN_B", help="another run of the same seed (docs/results/demo_fp32.json)")
    parser.add_argument("--results", default=None, help="write the comparison here (docs/results/demo_precision.json)")
    args = parser.parse_args(argv)
    results = compare_runs(read_run(Path(args.a)), read_run(Path(args.b)))
    text = write_results_file(results, args.results, __file__, argv)
    print(text)
    return 0


if __name__ == "__main__":
    run_script(main)
