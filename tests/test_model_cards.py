"""Model cards rendered from the model_cards/ templates and a real evaluation report: they parse,
their model-index holds only the report's numbers, and the usage snippet runs as written."""

from __future__ import annotations

import ast
import json
import re
import shutil

import pytest
import torch
from conftest import REPO, run_fresh_python, tiny_bert_config, write_tiny_tokenizer
from huggingface_hub import ModelCard
from transformers import BertForSequenceClassification

from hydra_hf import metrics, plots, report
from hydra_hf.convert import convert_checkpoint
from hydra_hf.hub import KINDS, build_model_card, card_template_path, select_model_row, stage_repository
from hydra_hf.masks import HeadMasks

KEPT = [[[0, 1], [2, 3], [1]], [[1, 2, 3], [0], []], [[0], [0, 1, 2, 3], [0, 2]]]
# report row key -> model-index metric type (what build_model_card maps)
ID_TYPES = {"accuracy": "accuracy", "brier": "brier_score", "nll": "nll", "ece": "ece", "aece": "adaptive_ece",
            "aurc": "aurc"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A converted tiny Hydra folder and a real report (two rows, OOD numbers, a reliability diagram)."""
    root = tmp_path_factory.mktemp("cards")
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config()).eval().save_pretrained(root / "tiny")
    write_tiny_tokenizer(root / "tiny")
    model_dir = root / "hydra"
    convert_checkpoint(HeadMasks(kept_heads=KEPT, num_heads=4), base=root / "tiny", output_dir=model_dir)
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(60, 3, generator=g) * 2, -1)
    labels = torch.randint(0, 3, (60,), generator=g)
    single = torch.softmax(torch.randn(60, 3, generator=g) * 4, -1)
    report_dir = root / "report"
    plots.reliability_diagram({"Hydra": (probs, labels), "single": (single, labels)}, report_dir / "reliability.png")
    rows = [
        {"method": "single model", **metrics.calibration_report(single, labels)},
        {"method": "Hydra (M=3)", **metrics.calibration_report(probs, labels),
         "svhn": metrics.ood_report(torch.rand(30, generator=g), torch.rand(30, generator=g) * 0.7),
         "latency_ms": 1.25, "params_m": 0.1},
    ]
    report.write_report({"rows": rows, "title": "Tiny SST-2 run", "figures": {"Reliability": "reliability.png"},
                         "dataset": {"name": "SST-2", "type": "glue", "config": "sst2", "split": "validation"}},
                        report_dir)
    return model_dir, report_dir


def _as_kind(model_dir, tmp_path, kind):
    """A copy of the folder whose auto_map names the head of ``kind`` (the card reads only config.json)."""
    folder = tmp_path / kind
    folder.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": config["auto_map"]["AutoConfig"], KINDS[kind]["auto_class"]: "x.Y"}
    config.pop("custom_pipelines", None)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_card_renders_parses_and_claims_only_report_numbers(assets, tmp_path, kind):
    model_dir, report_dir = assets
    folder = model_dir if kind == "text" else _as_kind(model_dir, tmp_path, kind)
    card = build_model_card(folder, report_dir, repo_id="org/hydra-tiny", revision="abc123",
                            base_model="google-bert/bert-base-uncased", license="apache-2.0",
                            report_links={"report": "evaluation/report.md", "reliability": "evaluation/reliability.png"})
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    data = loaded.data
    assert data.license == "apache-2.0" and data.base_model == "google-bert/bert-base-uncased"
    assert data.pipeline_tag == KINDS[kind]["pipeline_tag"] and "custom_code" in data.tags
    assert data.model_name == "hydra-tiny"
    # model-index: exactly the Hydra row's numbers, nothing else
    report_data = json.loads((report_dir / "report.json").read_text())
    row = select_model_row(report_data)
    assert row["method"] == "Hydra (M=3)"
    results = {(r.metric_type, r.metric_config): r.metric_value for r in data.eval_results}
    expected = {(t, None): row[k] for k, t in ID_TYPES.items()}
    expected.update({(m, "svhn"): row[f"svhn/{m}"] for m in ("auroc", "fpr95", "aupr_in", "aupr_out")})
    assert results == expected
    assert {r.dataset_name for r in data.eval_results} == {"SST-2"}
    assert {r.task_type for r in data.eval_results} == {KINDS[kind]["pipeline_tag"]}
    text = loaded.text
    assert f"| Hydra (M=3) | {row['accuracy']:.4f} " in text.replace("**", "")  # the report's table
    assert "![Reliability diagram](evaluation/reliability.png)" in text
    assert "trust_remote_code=True" in text and 'revision = "abc123"' in text and "2510.18358" in text
    assert "| member | L0 | L1 | L2 | total |" in text
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    ast.parse(snippet)  # valid Python (the text snippet is also run, below)


def test_card_without_report_claims_no_number(assets, tmp_path):
    model_dir, _ = assets
    card = build_model_card(model_dir, None, repo_id="org/hydra-tiny")
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert "model-index" not in loaded.data.to_dict() and not loaded.data.eval_results
    evaluation = loaded.text.split("## Evaluation")[1].split("## Limitations")[0]
    assert "No evaluation report" in evaluation and not re.search(r"\d\.\d", evaluation)
    assert loaded.data.license is None and "License.** Not recorded" in loaded.text
    assert 'revision = "main"' in loaded.text


def test_card_is_robust_to_partial_reports(assets, tmp_path):
    model_dir, _ = assets
    # only some fields, a missing value, no dataset, no title, no figures
    partial = {"rows": [{"method": "Hydra", "accuracy": 0.875, "ece": None, "nll": float("nan")}]}
    card = build_model_card(model_dir, partial, repo_id="org/x")
    card.save(tmp_path / "a.md")
    data = ModelCard.load(tmp_path / "a.md").data
    assert [(r.metric_type, r.metric_value, r.dataset_type) for r in data.eval_results] == [("accuracy", 0.875, "custom")]
    # several rows, none of them says which is this model: a table, but no claim in the metadata
    ambiguous = {"rows": [{"method": "a", "accuracy": 0.5}, {"method": "b", "accuracy": 0.6}]}
    card = build_model_card(model_dir, ambiguous, repo_id="org/x")
    card.save(tmp_path / "b.md")
    loaded = ModelCard.load(tmp_path / "b.md")
    assert not loaded.data.eval_results and "does not say which row is this model" in loaded.text
    assert "| b | **0.6000**" in loaded.text
    # the report may name the row
    card = build_model_card(model_dir, {**ambiguous, "model_row": "a"}, repo_id="org/x")
    card.save(tmp_path / "c.md")
    assert [r.metric_value for r in ModelCard.load(tmp_path / "c.md").data.eval_results] == [0.5]
    with pytest.raises(FileNotFoundError, match="report.json"):
        build_model_card(model_dir, tmp_path / "nowhere", repo_id="org/x")


def test_templates_are_found_and_kinds_are_known():
    for kind in KINDS:
        path = card_template_path(kind)
        assert path.is_file() and path.parent in (REPO / "model_cards", REPO / "src" / "hydra_hf" / "model_cards")
    with pytest.raises(ValueError, match="no model card template"):
        card_template_path("audio")


def test_usage_snippet_runs_as_written(assets, tmp_path):
    """The text card's snippet, with repo_id pointing at the staged repository, in a fresh process
    where hydra_hf cannot be imported (as for a Hub user)."""
    model_dir, report_dir = assets
    staged = tmp_path / "repo"
    stage_repository(model_dir, staged, repo_id=str(staged), report=report_dir)
    readme = (staged / "README.md").read_text()
    assert f'repo_id = "{staged}"' in readme
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    stdout = run_fresh_python(snippet, env={"HF_MODULES_CACHE": str(tmp_path / "modules")})
    assert "Do you wish to run the custom code" not in stdout  # every loader passes trust_remote_code
    lines = stdout.strip().splitlines()
    assert lines[0].split()[0] in {"LABEL_0", "LABEL_1", "LABEL_2"}
    result = ast.literal_eval(lines[-1])  # the pipeline's result dict
    assert set(result["uncertainty"]) == {"predictive_entropy", "expected_entropy", "mutual_information"}
    assert len(result["member_scores"]) == 3 and result["flagged"] is None
    shutil.rmtree(staged)
