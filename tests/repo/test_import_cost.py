"""`import hydra_hf` and every `hydra-hf COMMAND --help` import no heavy optional package (issue 49): in a fresh
interpreter, after transformers' own model classes and pipelines (what registering Hydra's classes needs; they
import accelerate, scipy and torchvision themselves), `import hydra_hf` and then building the full command-line
parser (what `--help` of any command does) add none of datasets, pandas, pyarrow, scikit-learn, open_clip, timm,
onnx, onnxruntime, matplotlib or peft beyond what transformers loaded. The time it takes is measured in
bench/bench_import.py, not here."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

HEAVY = ("datasets", "pandas", "pyarrow", "sklearn", "scipy.stats", "open_clip", "timm", "onnx", "onnxruntime",
         "matplotlib", "peft", "accelerate")
NEVER = ("datasets", "pandas", "pyarrow", "sklearn", "scipy.stats", "open_clip", "timm", "onnx", "onnxruntime",
         "matplotlib")
"""Loaded by neither transformers' model classes nor hydra_hf: `import hydra_hf` must leave them out entirely."""

PROBE = f"""
import json, sys
heavy = {list(HEAVY)!r}
loaded = lambda: sorted(m for m in heavy if m in sys.modules)
import torch, transformers
from transformers import PreTrainedModel
import transformers.pipelines
stages = {{"transformers": loaded()}}
import hydra_hf
stages["import hydra_hf"] = loaded()
stages["hydra_hf stages"] = sorted(m for m in sys.modules
                                   if m.startswith(("hydra_hf.hub", "hydra_hf.evaluation", "hydra_hf.calibration",
                                                    "hydra_hf.finetune")))
from hydra_hf.cli import build_parser
build_parser()  # every command's parser: what `hydra-hf COMMAND --help` builds
stages["hydra-hf --help"] = loaded()
print(json.dumps(stages))
"""


def test_import_hydra_hf_and_every_help_load_no_heavy_optional_package():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    stages = json.loads(done.stdout.strip().splitlines()[-1])
    transformers_own = set(stages["transformers"])
    assert not transformers_own & set(NEVER), stages  # else this test's premise changed: transformers loads them
    assert set(stages["import hydra_hf"]) == transformers_own, stages
    assert stages["hydra_hf stages"] == [], stages  # the stages are imported on first use
    # the parser imports every command module; beyond transformers' own packages at most peft, which
    # transformers.trainer_utils imports for the fine-tuning command
    assert set(stages["hydra-hf --help"]) - transformers_own <= {"peft"}, stages
