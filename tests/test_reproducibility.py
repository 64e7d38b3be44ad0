"""Pinned threads make training independent of the environment's thread settings (issue 38).

A tiny ViT (28x28 images, 2 layers x 4 heads, hidden 64) trained from scratch through
``finetune_members`` for one epoch (4 steps of 64 images, dropout on), the way the image testbed
trains its Singles, in fresh processes whose environment sets different thread counts
(``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` 1 or 2, which torch reads at start-up):

- without :func:`pin_threads` the weights differ (torch splits float reductions over the threads it
  got from the environment);
- with ``pin_threads(2)`` they are bit-identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import REPO
from safetensors.torch import load_file

from hydra_hf.reproducibility import THREAD_ENV_VARS, describe_threads, pin_threads, seed_worker

TRAIN = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import torch

    if sys.argv[2] == "pin":
        from hydra_hf.reproducibility import pin_threads

        pin_threads(2)
    import datasets
    import numpy as np
    from PIL import Image
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    from hydra_hf.finetune.baselines import all_heads_masks
    from hydra_hf.finetune import FinetuneConfig, finetune_members

    out = Path(sys.argv[1])
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 256)
    images = [Image.fromarray((rng.random((28, 28, 3)) * 80 + 60 * c).astype(np.uint8)) for c in labels]
    data = datasets.Dataset.from_dict({"image": images, "label": labels.tolist()})
    data = data.cast_column("image", datasets.Image())
    torch.manual_seed(0)
    config = ViTConfig(image_size=28, patch_size=4, num_channels=3, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128, hidden_dropout_prob=0.1, num_labels=3)
    ViTForImageClassification(config).save_pretrained(out / "base")
    ViTImageProcessor(do_resize=True, size={"height": 28, "width": 28}, image_mean=[0.5] * 3,
                      image_std=[0.5] * 3).save_pretrained(out / "base")
    recipe = FinetuneConfig(optimizer="adamw", learning_rate=1e-3, weight_decay=0.05, scheduler="cosine",
                            warmup_ratio=0.1, num_epochs=1, batch_size=64, eval_batch_size=128,
                            early_stopping_patience=None, freeze_embeddings=False, image_column="image", seed=0)
    finetune_members(out / "base", all_heads_masks(out / "base"), data, None, out / "fused", recipe,
                     work_dir=out / "work", overwrite=True, fuse=False)
    (out / "threads.json").write_text(json.dumps({"torch": torch.get_num_threads()}))
    """
)


def _train(tmp_path: Path, name: str, mode: str, threads: str) -> tuple[dict[str, torch.Tensor], int]:
    out = tmp_path / name
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, str(script), str(out), mode], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    weights = load_file(out / "work" / "member_0" / "model" / "model.safetensors")
    return weights, json.loads((out / "threads.json").read_text())["torch"]


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_pinned_threads_give_identical_weights_under_any_environment(tmp_path):
    free_1, threads_1 = _train(tmp_path, "free1", "free", "1")
    free_2, threads_2 = _train(tmp_path, "free2", "free", "2")
    assert (threads_1, threads_2) == (1, 2)  # torch took its thread count from the environment
    assert _max_difference(free_1, free_2) > 0.0  # and the weights depend on it (last bits after 4 steps; they grow)

    pinned_1, threads_1 = _train(tmp_path, "pin1", "pin", "1")
    pinned_2, threads_2 = _train(tmp_path, "pin2", "pin", "2")
    assert threads_1 == threads_2 == 2
    assert _max_difference(pinned_1, pinned_2) == 0.0
    assert _max_difference(pinned_1, free_2) == 0.0  # pinning changes the thread count, not the maths


def test_pin_threads_sets_and_reports_every_setting(monkeypatch):
    for name in (*THREAD_ENV_VARS, "TOKENIZERS_PARALLELISM", "CUBLAS_WORKSPACE_CONFIG"):
        monkeypatch.setenv(name, "7")
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        settings = pin_threads(1)
        assert settings["torch_threads"] == torch.get_num_threads() == 1
        assert settings["interop_threads"] == torch.get_num_interop_threads()
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert all(os.environ[name] == "1" for name in THREAD_ENV_VARS)
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false" and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert settings["env"]["OMP_NUM_THREADS"] == "1" and settings["deterministic"] is True
        json.dumps(settings)  # goes into results files as it is
        line = describe_threads(settings)
        assert line.startswith("threads pinned: torch 1, interop ") and "OMP/MKL 1/1" in line
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
                               capture_output=True, text=True, check=True)
        assert child.stdout.strip() == "1"  # child processes inherit the pinned count
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


@pytest.mark.parametrize(
    "bad, error", [(0, ValueError), (-2, ValueError), ("2", TypeError), (2.0, TypeError), (True, TypeError)]
)
def test_pin_threads_rejects_a_bad_count_in_one_line(bad, error):
    with pytest.raises(error, match="num_threads") as info:
        pin_threads(bad)
    assert "\n" not in str(info.value)


def test_seed_worker_seeds_numpy_and_random_from_torch():
    import random

    import numpy as np

    torch.manual_seed(123)
    seed_worker(0)
    a = (random.random(), float(np.random.random()))
    torch.manual_seed(123)
    seed_worker(0)
    assert (random.random(), float(np.random.random())) == a
    torch.manual_seed(124)
    seed_worker(0)
    assert (random.random(), float(np.random.random())) != a


def test_command_line_names_the_script_from_the_repository_root_and_quotes_its_arguments():
    from hydra_hf.reproducibility import command_line

    assert command_line("/anywhere/repo/examples/demo.py", ["--output", "out dir", "--seed", "1"]) == (
        "python examples/demo.py --output 'out dir' --seed 1")
    assert command_line(Path("bench") / "bench_bert.py", []) == "python bench/bench_bert.py"


def test_write_results_file_records_the_command_and_refuses_nan_before_writing(tmp_path):
    from hydra_hf.reproducibility import describe_machine, write_results_file

    path = tmp_path / "results" / "run.json"
    text = write_results_file({"rows": [1.5, Path("a")]}, path, "/repo/examples/x.py", ["--results", str(path)])
    assert json.loads(path.read_text()) == json.loads(text) == {
        "rows": [1.5, "a"], "command": f"python examples/x.py --results {path}", "machine": describe_machine()}
    mine = {"cpu": "recorded by the script", "isa": "AVX2", "cpuid": None, "bf16_products": None}
    assert json.loads(write_results_file({"machine": mine}, None, "examples/x.py", []))["machine"] == mine
    assert write_results_file({"rows": []}, None, "examples/x.py", []).endswith("\n")  # no path: nothing written
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_results_file({"rows": [float("nan")]}, tmp_path / "nan.json", "examples/x.py", [])
    assert not (tmp_path / "nan.json").exists()


INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""


def test_describe_machine_names_the_cpu_its_kernels_and_its_bf16_products():
    """The CPU a results file records: model name, vendor / family / model, the ISA torch dispatches to, and the
    native bf16 products (AMX preferred over AVX-512 bf16, none on a CPU with neither)."""
    import torch

    from hydra_hf.reproducibility import describe_machine

    isa = torch.backends.cpu.get_cpu_capability()
    assert describe_machine(INTEL) == {"cpu": "Intel(R) Xeon(R) Platinum 8480+",
                                       "cpuid": "GenuineIntel family 6 model 143", "isa": isa,
                                       "bf16_products": "amx_bf16"}
    amd = describe_machine("vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\nmodel name : AMD EPYC\n"
                           "flags : avx2 avx512f avx512_bf16\n")
    assert (amd["cpu"], amd["cpuid"], amd["bf16_products"]) == ("AMD EPYC", "AuthenticAMD family 25 model 17",
                                                                "avx512_bf16")
    bare = describe_machine("")  # no /proc/cpuinfo: the platform's name, no cpuid, no bf16 products
    assert bare["cpuid"] is None and bare["bf16_products"] is None and bare["cpu"]
