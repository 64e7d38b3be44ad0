"""`hydra-hf evaluate` is argparse -> EvaluateSpec -> evaluate: the spec has one field per option with the
option's default, checks itself when it is built, and the library call writes the report the command writes."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
from test_hostile_inputs import world  # noqa: F401  (a fixture: a tiny BERT, its Hydra folder, id.csv, ood.csv)

from hydra_hf.cli import evaluate as cli_evaluate
from hydra_hf.cli import main
from hydra_hf.evaluation.loading import folder_kind
from hydra_hf.workflows.evaluate import EvaluateSpec, EvaluationSpec, evaluate, evaluate_folder


def _parser_defaults() -> dict:
    parser = argparse.ArgumentParser()
    cli_evaluate.add_parser(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["evaluate"]
    return {a.dest: a.default for a in sub._actions if a.dest != "help"}


def test_the_spec_has_one_field_per_option_with_its_default():
    options = _parser_defaults()
    fields = {f.name: f for f in dataclasses.fields(EvaluateSpec)}
    assert set(fields) == set(options)
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert f.default == options[name], name
        elif f.default_factory is not dataclasses.MISSING:
            assert f.default_factory() == options[name], name


def _without_latency(value):
    if isinstance(value, dict):
        return {k: _without_latency(v) for k, v in value.items() if "latency" not in k}
    if isinstance(value, list):
        return [_without_latency(v) for v in value]
    return value


def test_evaluate_folder_writes_the_report_the_command_writes(world, tmp_path, capsys):  # noqa: F811
    assert folder_kind(world / "hydra") == folder_kind(world / "base") == "classifier"
    spec = EvaluateSpec(
        model=str(world / "hydra"),
        id_data=str(world / "id.csv"),
        ood_data=[f"rev={world / 'ood.csv'}"],
        report=str(tmp_path / "library"),
        baseline=[f"Single={world / 'base'}"],
        bootstrap=20,
    )
    done = evaluate(spec)
    assert done.kind == "classifier" and done.report == tmp_path / "library" and spec.batch_size is None  # not mutated
    rows = {row["method"]: row for row in done.result.rows}
    assert set(rows) == {"Hydra", "Single"} and rows["Hydra"]["accuracy"] != rows["Single"]["accuracy"]
    assert main(["evaluate", "--model", spec.model, "--id-data", spec.id_data, "--ood-data", spec.ood_data[0],
                 "--baseline", spec.baseline[0], "--bootstrap", "20", "--report", str(tmp_path / "command")]) == 0
    assert "| Hydra |" in capsys.readouterr().out
    library = json.loads((tmp_path / "library" / "report.json").read_text())
    command = json.loads((tmp_path / "command" / "report.json").read_text())
    assert _without_latency(library) == _without_latency(command)
    assert library["rows"][0]["accuracy"] == rows["Hydra"]["accuracy"]
    assert sorted(p.name for p in (tmp_path / "library").iterdir()) == sorted(
        p.name for p in (tmp_path / "command").iterdir()
    )


def test_the_spec_checks_itself_and_evaluate_checks_before_loading(world, tmp_path):  # noqa: F811
    given = dict(model=str(world / "hydra"), id_data=str(world / "id.csv"), ood_data=[str(world / "ood.csv")],
                 report=str(tmp_path / "r"))
    with pytest.raises(ValueError, match=r"^--temperature-scaling needs --val-data"):
        EvaluateSpec(**given, temperature_scaling=True)
    with pytest.raises(ValueError, match=r"^--baseline 'runs/single': write NAME=DIR"):
        EvaluateSpec(**given, baseline=["runs/single"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        EvaluateSpec(**given).score = "entropy"
    with pytest.raises(ValueError, match=r"is for causal LMs"):
        evaluate_folder(EvaluationSpec(**given, score="likelihood"))  # the earlier names: the same spec and call
    assert not (tmp_path / "r").exists()
