"""What `import hydra_hf` and `hydra-hf COMMAND --help` cost, side by side with `import torch, transformers`.

Every contender runs in a fresh interpreter (nothing is cached in the process; compiled ``.pyc`` files are, as on
a user's machine: ``PYTHONDONTWRITEBYTECODE`` is dropped for the children and a first round warms them),
round-robin over ``--rounds`` rounds so that the machine's load hits all alike; the rows are medians of the
child's CPU time (user + system: what a loaded machine inflates least) and of its wall time, with the heavy
optional packages each one left in ``sys.modules``. Target: ``import hydra_hf`` within 0.5 s of CPU of
``import torch, transformers``.

``import torch, transformers`` imports transformers lazily (no model code); registering Hydra's classes with the
Auto classes needs transformers' ``PreTrainedModel`` and its pipelines, which import accelerate, scipy and
torchvision themselves: the row "transformers' model classes" measures that floor.

    python bench/bench_import.py --rounds 5 --json docs/results/bench/import.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import table, write_results

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("datasets", "pandas", "pyarrow", "open_clip", "timm", "sklearn", "onnxruntime", "onnx", "accelerate",
         "matplotlib", "peft")
"""Optional heavy packages: `import hydra_hf` must load none that transformers' model classes do not load."""
REPORT = f"import json, sys; print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
CONTENDERS = {
    "import torch, transformers": ["-c", f"import torch, transformers; {REPORT}"],
    "transformers' model classes": ["-c", "import torch, transformers; from transformers import PreTrainedModel; "
                                          f"import transformers.pipelines; {REPORT}"],
    "import hydra_hf": ["-c", f"import hydra_hf; {REPORT}"],
    "hydra-hf finetune --help": ["-c", "import contextlib, io, sys; from hydra_hf.cli import main\n"
                                       "with contextlib.redirect_stdout(io.StringIO()):\n"
                                       "    try: main(['finetune', '--help'])\n"
                                       f"    except SystemExit: pass\n{REPORT}"],
}
TARGET_S = 0.5


def run_once(args: list[str]) -> tuple[float, float, list[str]]:
    """``(CPU s, wall s, heavy packages loaded)`` of one fresh interpreter running ``args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # cached bytecode, as users have it
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, check=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows to this results file")
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    loaded: dict[str, list[str]] = {}
    for name, argv in CONTENDERS.items():  # warm the file cache once: the rounds then read the same pages
        run_once(argv)
    for _ in range(args.rounds):
        for name, argv in CONTENDERS.items():
            cpu, wall, heavy = run_once(argv)
            samples[name].append((cpu, wall))
            loaded[name] = heavy
    base = statistics.median(c for c, _ in samples["import torch, transformers"])
    floor = statistics.median(c for c, _ in samples["transformers' model classes"])
    rows = []
    for name in CONTENDERS:
        cpu = statistics.median(c for c, _ in samples[name])
        rows.append({"contender": name, "cpu_s": cpu, "wall_s": statistics.median(w for _, w in samples[name]),
                     "x torch+transformers": cpu / base, "+ s over torch+transformers": cpu - base,
                     "heavy packages loaded": ", ".join(loaded[name]) or "none"})
    ours = next(r for r in rows if r["contender"] == "import hydra_hf")
    extra = sorted(set(loaded["import hydra_hf"]) - set(loaded["transformers' model classes"]))
    over = ours["+ s over torch+transformers"]
    summary = [
        f"import hydra_hf: {ours['cpu_s']:.2f} s of CPU, {over:+.2f} s over import torch, transformers (target <= "
        f"+{TARGET_S:g} s: {'met' if over <= TARGET_S else 'missed'}) and {ours['cpu_s'] - floor:+.2f} s over "
        "transformers' model classes, which registering Hydra's classes needs",
        "heavy packages import hydra_hf loads beyond transformers' own: " + (", ".join(extra) or "none"),
    ]
    columns = ["contender", "cpu_s", "wall_s", "x torch+transformers", "+ s over torch+transformers",
               "heavy packages loaded"]
    print(table(rows, columns))
    print("\n".join(summary))
    if args.json:
        write_results(args.json, {"torch_threads": "each interpreter's default"}, rows=rows,
                      columns=columns, summary=summary, rounds=args.rounds)


if __name__ == "__main__":
    main()
