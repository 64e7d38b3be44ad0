"""`ruff check` passes over src, tests, examples, bench and tools with the settings of pyproject.toml's
``[tool.ruff]`` (line length 119; pycodestyle, pyflakes and import order). Skipped where ruff is not
installed (`make setup` installs it with the ``dev`` extra)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO

PATHS = ("src", "tests", "examples", "bench", "tools")


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed: pip install -e '.[dev]'")
def test_ruff_check_passes():
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *PATHS]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    findings = [line.split(":")[0] for line in proc.stdout.splitlines() if line.split(":")[0].endswith(".py")]
    per_folder = Counter(str(Path(file).parent) for file in findings)  # folder -> findings
    folders = ", ".join(f"{folder}: {n}" for folder, n in sorted(per_folder.items()))
    assert proc.returncode == 0, f"`ruff check {' '.join(PATHS)}` finds ({folders}):\n{proc.stdout}{proc.stderr}"
