"""The paper-setting recipes (`examples/recipe_*.py`) in their `--smoke` mode: the same code as the
real runs (data preparation from DatasetDicts, pipeline, report, Hub folder) on tiny local models and
generated data, offline."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_report(result, out: Path, ood_sets: list[str]) -> None:
    run = out / "run"
    for stage in ("single", "masks.json", "hydra", "report/report.json", "report/report.md", "hub/README.md",
                  "hub/config.json", "timings.json"):
        assert (run / stage).exists(), stage
    report = json.loads((run / "report" / "report.json").read_text())
    assert sorted(report["ood_sets"]) == sorted(ood_sets)
    methods = [row["method"] for row in report["rows"]]
    assert (
        methods[0].startswith("Hydra") and "Single" in methods and "Single + TS" in methods and "MC Dropout" in methods
    )
    assert any(m.startswith("Deep Ensembles") for m in methods)
    for row in report["rows"]:
        for key in ("accuracy", "nll", "ece", "brier"):
            assert math.isfinite(row[key]), (row["method"], key)
        for name in ood_sets:
            assert 0.0 <= row[name]["auroc"] <= 1.0
    masks = json.loads((run / "masks.json").read_text())
    kept = [m["kept_heads"] for m in masks["members"]]
    assert len(kept) == 3 and kept[0] != kept[1]  # three members that differ
    assert json.loads((run / "hydra" / "config.json").read_text())["kept_heads"] == kept


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def test_sst2_bert_smoke(tmp_path):
    recipe = _load("recipe_sst2_bert")
    out = tmp_path / "sst2"
    result = recipe.main(["--smoke", "--output", str(out), "--threads", "1"])
    _check_report(result, out, list(recipe.OOD_SETS))
    masks = json.loads((out / "run" / "masks.json").read_text())
    # the paper's per-layer budget, scaled to the tiny model: 2 of 4 heads kept in every layer
    assert all(len(h) == 2 for m in masks["members"] for h in m["kept_heads"])
    # Hydra (Circ): one criterion per member
    assert [m["method"] for m in masks["members"]] == ["circuit-acc", "circuit-ood", "circuit-avg"]
    assert masks["budget"] == {"heads_per_layer": 2, "remove": None}
    assert result.hub_check["max_abs_prob_diff"] < 1e-4
    # the data went through the real preparation: GLUE validation became the test split
    import datasets

    sst2 = datasets.load_from_disk(str(out / "data" / "sst2"))
    assert (
        sorted(sst2) == ["test", "train", "validation"] and len(sst2["test"]) == 32 and len(sst2["validation"]) == 32
    )
    settings = result.report["settings"]
    assert (
        settings["early_stopping_patience"] == 2
        and settings["max_length"] == 16
        and settings["labels"] == ["negative", "positive"]
    )


def test_cifar100_vit_smoke(tmp_path):
    recipe = _load("recipe_cifar100_vit")
    out = tmp_path / "vit"
    result = recipe.main(["--smoke", "--output", str(out), "--threads", "1"])
    _check_report(result, out, list(recipe.OOD_SETS))
    masks = json.loads((out / "run" / "masks.json").read_text())
    assert all(len(h) == 3 for m in masks["members"] for h in m["kept_heads"])  # 3 of 4 kept in every block
    assert masks["method"] == "taylor"


def test_recipes_use_the_papers_budgets():
    """Each paper-setting script's budget, read from the script: heads kept in every layer, as the paper
    states them (issue 23: SST-2 BERT keeps 6 of 12 per layer, CIFAR-100 ViT about 10 of 12 per block),
    and the flags that change it."""
    from hydra_hf.pruning import Budget

    specs = {"train_data": "t", "validation_data": "v", "test_data": "x", "ood_test_data": {}}
    sst2 = _load("recipe_sst2_bert")
    p = sst2.paper_pipeline(Path("base"), specs)
    assert p.budget() == Budget(heads_per_layer=6) and p.budget().num_removed(12, 12) == 72
    assert p.method == "circuit-acc,circuit-ood,circuit-avg" and p.heads_per_step == 1
    assert p.prune_samples == 3000 and p.prune_data_fraction == 1.0 and sst2.VALIDATION_SIZE == 3000
    cifar = _load("recipe_cifar100_vit")
    q = cifar.paper_pipeline(Path("base"), {"train_data": "t", "validation_data": "v", "test_data": "x"})
    assert q.budget() == Budget(heads_per_layer=10) and q.budget().num_removed(12, 12) == 24
    # the flags: one of the two budgets, the paper's by default
    import argparse

    from hydra_hf.recipes import add_budget_arguments, budget_arguments

    parser = argparse.ArgumentParser()
    add_budget_arguments(parser, heads_per_layer=6)
    assert budget_arguments(parser.parse_args([])) == {"heads_per_layer": 6, "remove": None}
    assert budget_arguments(parser.parse_args(["--heads-per-layer", "8"])) == {"heads_per_layer": 8, "remove": None}
    assert budget_arguments(parser.parse_args(["--remove", "30"])) == {"heads_per_layer": None, "remove": 30}
    assert budget_arguments(parser.parse_args([]), smoke_heads_per_layer=2) == {"heads_per_layer": 2, "remove": None}
    with pytest.raises(SystemExit):
        parser.parse_args(["--remove", "3", "--heads-per-layer", "2"])
    with pytest.raises(ValueError, match="give exactly one budget"):
        sst2.paper_pipeline(Path("base"), specs, remove=30)  # both budgets given: refused
    with pytest.raises(ValueError, match="set the other one to None"):
        sst2.TextPipeline(heads_per_layer=6)  # remove keeps its default of 36: refused, naming the fix
    zs = _load("recipe_openclip_zeroshot")
    assert "24 is this project's choice" in zs.__doc__


def test_vit_pooled_features_feed_the_classifier():
    """Deep Ensembles (D) on ViT: the pooled features are exactly what the stock classifier sees."""
    from transformers import ViTConfig, ViTForImageClassification

    from hydra_hf.evaluation import pooled_features

    torch.manual_seed(0)
    model = ViTForImageClassification(
        ViTConfig(
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            image_size=16,
            patch_size=8,
            num_labels=3,
        )
    ).eval()
    batch = {"pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 1])}
    with torch.no_grad():
        feats = pooled_features(model, batch)  # (B, d)
        assert feats.shape == (2, 32)
        torch.testing.assert_close(
            model.classifier(feats), model(pixel_values=batch["pixel_values"]).logits, atol=1e-5, rtol=0
        )


def test_openclip_zeroshot_smoke(tmp_path):
    """The zero-shot OpenCLIP recipe (joint two-tower selection, 4 heads removed per member over both
    towers): report, Hub folder, and the fresh-process reload's member probabilities."""
    recipe = _load("recipe_openclip_zeroshot")
    out = tmp_path / "openclip"
    result = recipe.main(["--smoke", "--output", str(out), "--threads", "1"])
    run = out / "run"
    for stage in ("single.json", "masks.json", "hydra/config.json", "member_0/config.json", "report/report.json",
                  "report/report.md", "report/reliability.png", "report/ood_scores.png", "hub/README.md",
                  "hub/config.json", "hub/tokenizer.json", "hub/evaluation/report.json", "timings.json"):
        assert (run / stage).exists(), stage
    report = json.loads((run / "report" / "report.json").read_text())
    assert sorted(report["ood_sets"]) == ["noise", "photos"] and report["test_images"] == 48
    rows = {row["method"]: row for row in report["rows"]}
    assert list(rows)[0] == "Hydra (taylor, M=3, joint)"
    assert {"Single", "Single + TS", "Hydra + TS", "Single pruned (member 0)"} <= set(rows)
    assert rows["Hydra (taylor, M=3, joint)"]["members"] == 3 and rows["Single"]["members"] == 1
    for row in report["rows"]:
        for key in ("accuracy", "nll", "ece", "brier"):
            assert math.isfinite(row[key]), (row["method"], key)
        for name in ("noise", "photos"):
            assert 0.0 <= row[name]["auroc"] <= 1.0
    assert rows["Hydra (taylor, M=3, joint)"]["mutual_information"] > 0  # the members disagree
    assert report["temperature_single"] > 0 and report["single_validation"]["validation_images"] == 32
    # joint selection: 4 heads removed per member, counted over both towers (2 layers x 4 heads each)
    masks = json.loads((run / "masks.json").read_text())
    assert masks["tower"] == "joint" and sorted(masks["towers"]) == ["text", "vision"]
    kept = [m["kept_heads"] for m in masks["members"]]
    assert len(kept) == 3 and kept[0] != kept[1]
    assert all(sum(4 - len(h) for t in ("vision", "text") for h in k[t]) == 4 for k in kept)
    hydra_config = json.loads((run / "hydra" / "config.json").read_text())
    assert hydra_config["vision_kept_heads"] == [k["vision"] for k in kept]
    assert hydra_config["text_kept_heads"] == [k["text"] for k in kept]
    # the Hub folder reloads in a fresh process (no hydra_hf) with the same member probabilities
    assert (
        result.hub_check["predictions"]["max_abs_prob_diff"] < 1e-4 and result.hub_check["predictions"]["members"] == 3
    )
    assert result.hub_check["validate"]["pipeline"] is not None


def test_run_script_gives_the_commands_error_contract(monkeypatch, capsys):
    """`hydra_hf.cli.run_script`: bad input exits 2 with one line; a bug keeps its traceback;
    HYDRA_HF_TRACEBACK=1 shows the traceback of bad input too; main's return value is the status."""
    from hydra_hf.cli import run_script
    from hydra_hf.errors import HydraInputError

    monkeypatch.setattr("sys.argv", ["some_example.py"])

    def bad_input():
        raise HydraInputError("folder 'x' is not empty\nsecond line of detail")

    with pytest.raises(SystemExit) as exit_info:
        run_script(bad_input)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "some_example.py: error: folder 'x' is not empty\n"
    with pytest.raises(KeyError):
        run_script(lambda: {}["bug"])
    monkeypatch.setenv("HYDRA_HF_TRACEBACK", "1")
    with pytest.raises(HydraInputError):
        run_script(bad_input)
    with pytest.raises(SystemExit) as exit_info:
        run_script(lambda: 3)
    assert exit_info.value.code == 3
    # a recipe's main returns its result (a PipelineResult, a table): success, not a TypeError at the end
    for result in ({"rows": []}, object(), None):
        with pytest.raises(SystemExit) as exit_info:
            run_script(lambda result=result: result)
        assert exit_info.value.code == 0


def test_examples_refuse_bad_input_in_one_line(tmp_path):
    """The scripts users run: a folder hydra_hf did not create is refused without a traceback and left
    untouched (also by the study's --table-only, which would write its table there); a malformed --single
    and an unknown candidate are argparse errors; nothing is written."""
    import os
    import subprocess
    import sys

    users = tmp_path / "users-folder"
    users.mkdir()
    (users / "notes.txt").write_text("keep me")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_HF_TRACEBACK", None)
    runs = {
        "demo": [sys.executable, str(EXAMPLES / "demo.py"), "--output", str(users)],
        "study": [sys.executable, str(EXAMPLES / "study_text.py"), "--output", str(tmp_path / "study"),
                  "--single", f"0={tmp_path / 'missing'}", "--candidates", "3"],
        "candidate": [sys.executable, str(EXAMPLES / "study_text.py"), "--candidates", "99", "--table-only"],
        "table": [sys.executable, str(EXAMPLES / "study_text.py"), "--output", str(users), "--table-only"],
    }
    for name, cmd in runs.items():
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        lines = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and len(lines) == 1, (name, proc.stderr[-2000:])
        assert {"demo": "was not created by", "study": "is not a model folder",
                "candidate": "is not a candidate index", "table": "no study in"}[name] in lines[0]
    assert sorted(p.name for p in users.iterdir()) == ["notes.txt"] and (users / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "study").exists()
