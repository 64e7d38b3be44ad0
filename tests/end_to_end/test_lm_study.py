"""examples/lm_study.py at tiny scale (a tiny random Llama, the real text sources, a few windows): the whole study
end to end, its results file and every view docs/decoders.md and the README render from it, a resume that
recomputes only the missing cell, and a changed setting refused in one line.

About 70 s of CPU (two seeds, the baselines trained once, through the library's fine-tuning runs; three
collects): the one test of the study's script as a user runs it."""

from __future__ import annotations

import argparse
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
        "--ood-val", "3", "--steps", "2", "--batch-size", "4", "--members", "2", "--heads", "3", "2",
        "--finetune", "H2", "slim", "--slim-heads", "1", "--slim-mlp", "0.5",
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
lm_study = _load("lm_study_for_its_test", REPO / "examples" / "lm_study.py")


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
    written = [line.split(" cell ")[1].split(".json")[0] for line in proc.stderr.splitlines() if " cell " in line]
    return {"root": root, "base": base, "results": json.loads((root / "results.json").read_text()),
            "written": written}


def cells_dir(study) -> Path:
    return study["root"] / "out" / "cells"


def test_the_results_file_holds_every_model_seed_and_comparison(study):
    r = study["results"]
    assert [row["model"] for row in r["rows"]] == MODELS and r["seeds"] == [0, 1] and r["members"] == 2
    assert r["pending"] == [] and r["pending_cells"] == [] and r["complete"] and r["decode_seeds"] == [0, 1]
    assert r["command"].startswith("python examples/lm_study.py --base ")
    assert r["kinds"] == ["code", "chinese", "headlines", "hamlet"]
    assert r["sizes"] == {"selection_pool": 16, "id_val": 6, "finetune": 8, "id_test": 8, "code": 4, "code_val": 3,
                          "chinese": 4, "chinese_val": 3, "headlines": 4, "headlines_val": 3, "hamlet": 4,
                          "hamlet_val": 3}
    assert {name: (b["kept_query_heads"], b["finetune"]) for name, b in r["budgets"].items()} == {
        "H3": (3, False), "H2": (2, True), "slim": (1, True)}
    assert r["budgets"]["H3"]["kept_kv_heads_mean"] == 2.0  # 3 of 4 query heads keep both key/value groups
    by = {row["model"]: row for row in r["rows"]}
    for model in ("Single", "Single + ft", "LoRA-Single"):  # one model: no members to disagree
        assert "mutual_information" not in by[model]["auroc"]["code"]
    for model in ("LoRA-Ensemble", "Hydra H2", "Hydra slim + ft"):
        assert set(by[model]["auroc"]["code"]) == {"msp", "entropy", "mutual_information", "likelihood"}
    # the baselines are trained once, the same on every seed; the LoRA-Single is each adapter alone
    assert r["baselines"] == ["LoRA-Ensemble", "LoRA-Single", "Single", "Single + ft"]
    assert [by[m]["seeds"] for m in ("Single", "Single + ft", "LoRA-Ensemble")] == [1, 1, 1]
    assert by["LoRA-Single"]["seeds"] == 2 and by["LoRA-Single"]["over"] == "adapters"
    lora = json.loads((cells_dir(study) / "lora.json").read_text())
    ppl = [lora[f"member{i}"]["id"]["perplexity"] for i in (0, 1)]
    assert by["LoRA-Single"]["perplexity"][0] == pytest.approx(sum(ppl) / 2)
    assert by["Hydra H2"]["seeds"] == 2 and by["Hydra H2"]["seed_list"] == [0, 1]
    assert {name: d["sign"] for name, d in r["score_directions"].items()} == {
        "msp": 1.0, "entropy": -1.0, "mutual_information": -1.0, "likelihood": -1.0}
    cells = study["root"] / "out" / "cells"
    # the best score is the one of highest validation AUROC (mean over the seeds), reported on the test windows
    hydra = [json.loads((cells / f"H2_seed{s}.json").read_text()) for s in (0, 1)]
    for kind in r["kinds"]:
        val_auroc = {s: sum(c["val"][kind][s] for c in hydra) / 2 for s in hydra[0]["val"][kind]}
        assert by["Hydra H2"]["best"][kind] == max(val_auroc, key=val_auroc.get)
        assert by["Hydra H2"]["val_auroc"][kind]["msp"][0] == pytest.approx(val_auroc["msp"])
    # a comparison is the per-seed difference of the two models' best scores, as the cells hold them
    key = ("Hydra H2", "LoRA-Ensemble", "code AUROC")
    c = next(c for c in r["comparisons"] if (c["a"], c["b"], c["metric"]) == key)
    want = [json.loads((cells / f"H2_seed{s}.json").read_text())["ood"]["code"]["auroc"][c["score_a"]]
            - json.loads((cells / "lora.json").read_text())["all"]["ood"]["code"]["auroc"][c["score_b"]]
            for s in (0, 1)]  # the one LoRA-Ensemble is every seed's anchor
    assert c["per_seed"] == pytest.approx(want) and len(c["bootstrap"]) == 2 and c["n"] == 2
    assert c["score_a"] == by["Hydra H2"]["best"]["code"] and c["score_b"] == by["LoRA-Ensemble"]["best"]["code"]
    pairs = {(c["a"], c["b"]) for c in r["comparisons"]}
    assert pairs == {(h, b) for h in MODELS if h.startswith("Hydra") for b in ("Single", "Single + ft",
                                                                                "LoRA-Ensemble")} | {
        ("LoRA-Ensemble", "Single"), ("LoRA-Ensemble", "Single + ft")}
    # the decode cell measured every group at both batch sizes; a fused Hydra decodes its members' tokens
    assert set(r["decode"]["1"]) == {"Single", "LoRA-Ensemble", "Hydra H3", "H3 members one by one", "Hydra H2",
                                     "Hydra H2 + ft", "H2 members one by one", "Hydra slim", "Hydra slim + ft",
                                     "slim members one by one"}
    assert r["decode"]["2"]["Single"]["cost_x_single"][0] == pytest.approx(1.0)
    decode = [json.loads((cells / f"decode_seed{s}.json").read_text())["speed"]["2"] for s in (0, 1)]
    ratio = [d["H2 members one by one"]["decode_tokens_per_s"] / d["Hydra H2 + ft"]["decode_tokens_per_s"]
             for d in decode]
    assert r["decode"]["2"]["Hydra H2 + ft"]["cost_x_members"][0] == pytest.approx(sum(ratio) / 2)
    assert set(r["decode"]["fused_equals_members_tokens"].values()) == {1.0}
    assert set(r["training_losses"]) == {"Single + ft", "LoRA-Ensemble", "Hydra H2 + ft", "Hydra slim + ft"}
    for model, runs in r["training_losses"].items():
        members = 1 if model == "Single + ft" else 2
        assert len(runs) == (1 if model in r["baselines"] else 2)
        assert all(len(seed) == members and all(len(m["curve"]) == m["steps"] == 2 for m in seed) for seed in runs)
    assert r["untrained"] == {"Single + ft": "Single", "LoRA-Ensemble": "Single", "Hydra H2 + ft": "Hydra H2",
                              "Hydra slim + ft": "Hydra slim"}


def test_the_cells_come_in_the_order_that_decides_most_first(study):
    # no training before every seed's pruned Hydras and decode speeds; the baselines once; then seed by seed
    assert study["written"] == ["data", "single", "H3_seed0", "H2_seed0", "slim_seed0", "decode_seed0", "H3_seed1",
                                "H2_seed1", "slim_seed1", "decode_seed1", "single-ft", "lora", "H2-ft_seed0",
                                "slim-ft_seed0", "H2-ft_seed1", "slim-ft_seed1"]
    budgets = lm_study.study_budgets(argparse.Namespace(heads=[3, 2], slim_heads=1, slim_mlp=0.5,
                                                        finetune=["H2", "slim"]))
    assert lm_study.planned_cells(budgets, [0, 1]) == study["written"][1:]  # what --collect lists as pending


def test_the_single_fine_tuned_is_one_member_keeping_every_head(study):
    cell = json.loads((cells_dir(study) / "single-ft.json").read_text())
    assert cell["id"]["num_members"] == 1 and "mutual_information" not in cell["id"]["error_detection"]
    single = json.loads((study["root"] / "out" / "cells" / "single.json").read_text())
    assert cell["id"]["nll"] != single["id"]["nll"]  # trained: the weights moved


def test_every_view_renders_the_results_file(study):
    r = study["results"]
    table = render_docs.VIEWS["lm-study"](r)
    assert "| Hydra 2/4 heads + ft | 2 seeds |" in table and "| Single | 1 (baseline) |" in table
    assert "| Single | 1 (baseline) | " + f"{r['rows'][0]['perplexity'][0]:.1f} |" in table  # one cell: no ± 0
    assert "| Single + ft | 1 (baseline) |" in table and "| LoRA-Single | 2 adapters |" in table
    assert "Hydra slim (1/4 heads, 50 % MLP): its members one by one" in table
    assert "INTERIM" not in table
    comparisons = render_docs.VIEWS["lm-study-comparisons"](r)
    assert comparisons.count("\n| Hydra") == 5 * 3 and comparisons.count("\n| LoRA-Ensemble (2) −") == 2
    assert "| Hydra 2/4 heads + ft − Single + ft | 2 |" in comparisons
    summary = render_docs.VIEWS["lm-study-summary"](r)
    assert summary.count("- **Hydra") == 5 and summary.count("- **LoRA-Ensemble") == 1
    assert "Over up to 2 member-selection seeds" in summary and "(n = 2 seeds)" in summary
    data = render_docs.VIEWS["lm-study-data"](r)
    assert "| code | 4 | the Python standard library's" in data and "| code_val | 3 | the same |" in data
    assert "of the 2 key/value heads" in data
    single_minutes = json.loads((cells_dir(study) / "single.json").read_text())["seconds"] / 60
    assert f"the Single {single_minutes:.0f} min," in data
    scores = render_docs.VIEWS["lm-study-scores"](r)
    assert scores.count("\n| Hydra 2/4 heads + ft |") == 4 and scores.count("\n| Single |") == 3
    training = render_docs.VIEWS["lm-study-training"](r)
    assert training.count("\n| ") == 4 and "loss at step 2" in training  # the trained models
    readme = render_docs.VIEWS["lm-study-readme"](r)
    table, verdicts = readme.split("\n\n", 1)
    assert table.count("\n") == 1 + len(MODELS) - 1 and verdicts.count("\n- Hydra") == 5


def test_an_auroc_below_chance_is_marked_as_such():
    assert render_docs._lm_auroc([0.42, 0.01]) == "0.420 ± 0.010¹"
    assert render_docs._lm_auroc([0.5, 0.0]) == "0.500 ± 0.000"


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


def test_collect_summarises_the_cells_so_far_and_lists_the_pending_models(study):
    root, cells = study["root"], study["root"] / "out" / "cells"
    moved = root / "H2-ft_seed1.json"
    (cells / "H2-ft_seed1.json").rename(moved)
    try:
        proc = _run(study["base"], root / "out", root / "partial.json", "--collect")
    finally:
        moved.rename(cells / "H2-ft_seed1.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    partial = json.loads((root / "partial.json").read_text())
    assert "--collect" not in partial["command"] and partial["collected_with"].endswith(" --collect")
    assert partial["pending"] == ["Hydra H2 + ft"] and partial["pending_cells"] == ["H2-ft_seed1"]
    assert not partial["complete"]
    by = {row["model"]: row for row in partial["rows"]}
    assert by["Hydra H2 + ft"]["seed_list"] == [0] and by["Hydra H2"]["seed_list"] == [0, 1]
    # a comparison is over the seeds both models have, and says so; one seed decides nothing
    ft = [c for c in partial["comparisons"] if c["a"] == "Hydra H2 + ft"]
    assert ft and all(c["n"] == 1 and c["seeds"] == [0] and not c["decided"] for c in ft)
    assert all(c["n"] == 2 for c in partial["comparisons"] if c["a"] == "Hydra H2")
    for view in ("lm-study", "lm-study-comparisons", "lm-study-summary", "lm-study-readme"):
        assert "INTERIM: the study's cells H2-ft_seed1 are pending" in render_docs.VIEWS[view](partial)
    assert "| Hydra 2/4 heads + ft − Single | 1 |" in render_docs.VIEWS["lm-study-comparisons"](partial)
    assert "- Hydra 2/4 heads + ft: against the Single undecided (n = 1: one seed decides nothing)" in \
        render_docs.VIEWS["lm-study-readme"](partial)


def test_collect_of_a_study_with_only_its_first_cells_writes_a_results_file(study, tmp_path):
    out = tmp_path / "out"
    (out / "cells").mkdir(parents=True)
    for name in ("settings.json", "data.json", "cells/single.json", "cells/H3_seed0.json"):
        (out / name).write_bytes((study["root"] / "out" / name).read_bytes())
    (out / "masks").mkdir()
    (out / "masks" / "H3_seed0.json").write_bytes((study["root"] / "out" / "masks" / "H3_seed0.json").read_bytes())
    proc = _run(study["base"], out, tmp_path / "early.json", "--collect")
    assert proc.returncode == 0, proc.stderr[-3000:]
    early = json.loads((tmp_path / "early.json").read_text())
    assert [row["model"] for row in early["rows"]] == ["Single", "Hydra H3"] and early["decode"] == {}
    assert {(c["a"], c["b"], c["n"]) for c in early["comparisons"]} == {("Hydra H3", "Single", 1)}
    for view in ("lm-study", "lm-study-comparisons", "lm-study-summary", "lm-study-readme", "lm-study-data",
                 "lm-study-scores", "lm-study-training"):
        render_docs.VIEWS[view](early)  # every view renders an early results file


def test_a_budget_the_study_does_not_have_is_a_one_line_error(study):
    root = study["root"]
    proc = _run(study["base"], root / "out", root / "other.json", "--finetune", "H9")
    assert proc.returncode == 2 and "--finetune H9" in assert_one_line_error(proc.stderr)
