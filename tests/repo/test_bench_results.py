"""bench/'s results files: every benchmark writes them through ``bench/_common.write_results``, which names the
command that reproduces the file and the machine's state beside the rows."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import sys

import pytest
from conftest import REPO


@pytest.fixture
def common(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import _common

    return _common


def test_results_file_names_the_command_that_wrote_it(common, monkeypatch, tmp_path):
    argv = [str(REPO / "bench" / "bench_bert.py"), "--batch-sizes", "1", "8", "--json", str(tmp_path / "it's.json")]
    monkeypatch.setattr(sys, "argv", argv)
    rows = [{"batch": 1, "model": "Single", "latency_ms": 101.5, "file_MB": float("nan"), "x": [float("inf"), 2.0]}]
    written = common.write_results(tmp_path / "it's.json", {"torch_threads": 2}, rows=rows, targets=["met"])
    on_disk = json.loads((tmp_path / "it's.json").read_text())
    assert on_disk == written
    # a path from the repository root, quoted the way a shell reads it back
    assert on_disk["command"] == f"python bench/bench_bert.py --batch-sizes 1 8 --json '{tmp_path}/it'\"'\"'s.json'"
    # a cell that does not apply (NaN) is null: JSON has no NaN
    assert on_disk["rows"] == [{"batch": 1, "model": "Single", "latency_ms": 101.5, "file_MB": None, "x": [None, 2.0]}]
    assert on_disk["targets"] == ["met"] and on_disk["threads"] == {"torch_threads": 2}
    assert on_disk["torch"] and on_disk["cpu_count"] >= 1 and len(on_disk["load_average"]) == 3
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: nothing half-written is left


def test_every_benchmark_writes_its_json_through_write_results():
    for script in sorted((REPO / "bench").glob("bench_*.py")):
        text = script.read_text(encoding="utf-8")
        if "--json" in text:
            assert "write_results(args.json" in text, f"{script.name} writes its --json file another way"



def test_every_name_a_benchmark_imports_from_hydra_hf_exists():
    """bench/ is not run by the suite (its numbers need a quiet machine), so a renamed or moved library name
    would break it silently: every ``from hydra_hf... import NAME`` in it, at any depth, must resolve."""
    missing = []
    for script in sorted((REPO / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hydra_hf"):
                module = importlib.import_module(node.module)
                missing += [f"{script.name}:{node.lineno}: {node.module}.{alias.name}" for alias in node.names
                            if not hasattr(module, alias.name)
                            and importlib.util.find_spec(f"{node.module}.{alias.name}") is None]
    assert not missing, missing
