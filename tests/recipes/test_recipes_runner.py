"""The recipes' stage runner (resume, fresh outputs, timings) and the package's import rule: a
setting's module imports no private name from a sibling."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from hydra_hf.recipes import Stage, StageRunner

RECIPES = Path(__file__).resolve().parents[2] / "src" / "hydra_hf" / "recipes"


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return text


def test_resume_keeps_finished_stages_and_reruns_fresh_ones(tmp_path):
    calls: list[str] = []

    def pipeline(resume: bool) -> StageRunner:
        runner = StageRunner(tmp_path / "run", resume=resume)
        out = runner.output_dir
        a = runner.run(Stage("a", out / "a.txt", lambda: calls.append("a") or _write(out / "a.txt", "A"),
                             load=lambda: (out / "a.txt").read_text()))
        assert a == "A"
        runner.run(Stage("b", [out / "b.txt", out / "c.txt"], lambda: calls.append("b") or _write(out / "b.txt", "B")))
        report = out / "report"

        def fresh():
            calls.append("report")
            assert not report.exists()  # a non-resumable stage starts from nothing
            report.mkdir()
            (report / "r.json").write_text("{}")

        runner.run(Stage("report", report, fresh, resumable=False))
        return runner

    first = pipeline(resume=False)
    assert calls == ["a", "b", "report"] and list(first.timings) == ["a", "b", "report"]
    assert all(t >= 0 for t in first.timings.values())
    calls.clear()
    second = pipeline(resume=True)
    # a is kept (its load gives the value); b re-runs (c.txt is missing); the report always re-runs
    assert calls == ["b", "report"] and list(second.timings) == ["b", "report"]
    result = second.finish({"rows": [{"method": "Hydra", "accuracy": 0.5}]}, {"ok": True})
    assert json.loads((tmp_path / "run" / "timings.json").read_text()) == second.timings
    assert result.output_dir == (tmp_path / "run").resolve() and "Hydra" in result.table


def test_runner_refuses_a_folder_it_did_not_create(tmp_path):
    from hydra_hf.errors import HydraOutputError

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.md").write_text("mine")
    with pytest.raises(HydraOutputError, match="was not created by `hydra-hf recipe`"):
        StageRunner(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.md").read_text() == "mine"


def test_setting_modules_import_no_private_name_from_a_sibling():
    offenders = []
    for path in RECIPES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:  # from .x import ...
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []
    assert (
        not (RECIPES.parent / "recipes_image.py").exists() and not (RECIPES.parent / "recipes_zero_shot.py").exists()
    )


def test_every_public_recipe_name_imports_from_the_package():
    import hydra_hf.recipes as recipes

    for name in ("TextPipeline", "run_text_pipeline", "ImagePipeline", "run_image_pipeline", "ZeroShotPipeline",
                 "run_zero_shot_pipeline", "PipelineResult", "packaged_minilm", "save_open_clip_folder",
                 "TOWER_CHOICES"):
        assert name in recipes.__all__ and getattr(recipes, name) is not None
