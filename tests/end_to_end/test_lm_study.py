"""examples/lm_study.py at tiny scale (a tiny random Llama, the real text sources, a few windows): the whole study
end to end, its results file and every view docs/decoders.md and the README render from it, a resume that
recomputes only the missing cell, and a changed setting refused in one line.

About 30 s of CPU (two seeds of eight trained models each, through the library's fine-tuning runs): the one test
of the study's script as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hostile import assert_one_line_error
from _tiny_decoders import save_llama

REPO = Path(__file__).resolve().parents[2]
TINY = ["--tokens", "8", "--selection", "8", "--selection-pool", "16", "--id-test", "8", "--ood", "4", "--id-val", "6",
        "--ood-val", "3", "--steps", "2", "--batch-size", "4", "--members", "2", "--heads", "3", "2", "--finetune", "H2",
        "slim", "--slim-heads", "1", "--slim-mlp", "0.5",
        "--decode-batches", "1", "2", "--prompt-tokens", "4", "--new-tokens", "3", "--decode-rounds", "1",
        "--n-boot", "20", "--seeds", "0", "1"]
MODELS = ["Single", "Single + ft", "LoRA-Single", "LoRA-Ensemble", "Hydra H3", "Hydra H2", "Hydra H2 + ft",
          "Hydra slim", "Hydra slim + ft"]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_docs = _load("render_docs_for_lm_study", REPO / "tools" / "render_docs.py")


def _run(base: Path, out: Path, results: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, str(REPO / "examples" / "lm_study.py"), "--base", str(base), "--output",
                           str(out), "--results", str(results), *TINY, *extra], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env=env)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-study")
    base = save_llama(root / "llama", head="ForCausalLM", pad=True)
    proc = _run(base, root / "out", root / "results.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "base": base, "results": json.loads((root / "results.json").read_text())}


def test_the_results_file_holds_every_model_seed_and_comparison(study):
    r = study["results"]
    assert [row["model"] for row in r["rows"]] == MODELS and r["seeds"] == [0, 1] and r["members"] == 2
    assert r["command"].startswith("python examples/lm_study.py --base ")
    assert r["kinds"] == ["code", "chinese", "headlines", "hamlet"]
    assert r["sizes"] == {"selection_pool": 16, "finetune": 8, "id_test": 8, "code": 4, "chinese": 4, "headlines": 4,
                          "hamlet": 4}
    by = {row["model"]: row for row in r["rows"]}
    assert "mutual_information" not in by["Single"]["auroc"]["code"]  # one model: no members to disagree
    assert "mutual_information" not in by["LoRA-Single"]["auroc"]["code"]
    for model in ("LoRA-Ensemble", "Hydra K", "Hydra slim + ft"):
        assert set(by[model]["auroc"]["code"]) == {"msp", "entropy", "mutual_information", "likelihood"}
    assert by["Single"]["seeds"] == 1  # the stock model is the same on every seed
    cells = study["root"] / "out" / "cells"
    # a comparison is the per-seed difference of the two models' best scores, as the cells hold them
    key = ("Hydra K", "LoRA-Ensemble", "code AUROC")
    c = next(c for c in r["comparisons"] if (c["a"], c["b"], c["metric"]) == key)
    want = [json.loads((cells / f"K_seed{s}.json").read_text())["ood"]["code"]["auroc"][c["score_a"]]
            - json.loads((cells / f"lora_seed{s}.json").read_text())["all"]["ood"]["code"]["auroc"][c["score_b"]]
            for s in (0, 1)]
    assert c["per_seed"] == pytest.approx(want) and len(c["bootstrap"]) == 2
    assert c["score_a"] == by["Hydra K"]["best"]["code"] and c["score_b"] == by["LoRA-Ensemble"]["best"]["code"]
    # the decode cell measured every group at both batch sizes; a fused Hydra decodes its members' tokens
    assert set(r["decode"]["1"]) == {"Single", "LoRA-Ensemble", "Hydra K", "K members one by one", "Hydra slim",
                                     "slim members one by one", "Hydra K + ft", "Hydra slim + ft"}
    assert r["decode"]["2"]["Single"]["cost_x_single"][0] == pytest.approx(1.0)
    assert set(r["decode"]["fused_equals_members_tokens"].values()) == {1.0}
    for runs in r["training_losses"].values():
        assert len(runs) == 2 and all(len(seed) == 2 and all(m["steps"] == 2 for m in seed) for seed in runs)


def test_every_view_renders_the_results_file(study):
    r = study["results"]
    table = render_docs.VIEWS["lm-study"](r)
    assert "| Hydra 2/4 heads + ft | 2 |" in table and "| Single | 1 |" in table
    assert "Hydra slim (1 heads, 50 % MLP): its members one by one" in table
    comparisons = render_docs.VIEWS["lm-study-comparisons"](r)
    assert comparisons.count("\n") == 2 + sum(c["b"] != "LoRA-Single" for c in r["comparisons"])
    summary = render_docs.VIEWS["lm-study-summary"](r)
    assert summary.count("- **Hydra") == 4 and "Over 2 member-selection seeds" in summary
    data = render_docs.VIEWS["lm-study-data"](r)
    assert "| code | 4 | the Python standard library's" in data and "| id_test | 8 | Rotten Tomatoes" in data
    readme = render_docs.VIEWS["lm-study-readme"](r)
    table, verdicts = readme.split("\n\n", 1)
    assert table.count("\n") == 1 + len(MODELS) and verdicts.count("\n- Hydra") == 4


def test_a_rerun_resumes_from_the_cache_and_recomputes_only_a_missing_cell(study):
    root, cells = study["root"], study["root"] / "out" / "cells"
    before = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.json")}
    (cells / "slim-ft_seed1.json").unlink()
    proc = _run(study["base"], root / "out", root / "again.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p.name: p.stat().st_mtime_ns for p in cells.glob("*.json")}
    assert after.keys() == before.keys()
    assert [name for name in after if after[name] != before[name]] == ["slim-ft_seed1.json"]
    again = json.loads((root / "again.json").read_text())
    assert again["rows"] == study["results"]["rows"]  # pinned threads: the retrained cell repeats exactly


def test_other_settings_on_the_same_cache_are_one_line_errors(study):
    root = study["root"]
    proc = _run(study["base"], root / "out", root / "other.json", "--lora-lr", "0.01")
    assert proc.returncode == 2 and "lora_lr" in assert_one_line_error(proc.stderr)
    assert not (root / "other.json").exists()
