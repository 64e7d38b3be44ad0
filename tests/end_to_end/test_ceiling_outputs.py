"""The ceiling scripts' ``--output`` follows the rule of every command (hydra_hf.outputs): a new or empty
folder, or one the script created (a re-run resumes from it); a file or a folder of the user's is one
line, before any work, and left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _hostile import assert_one_line_error, tree_digest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = {"ceiling_image.py": [], "ceiling_text.py": ["--seeds", "0", "1"]}


def _run(script: str, output: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--output", str(output), *SCRIPTS[script]],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_output_naming_a_file_or_a_users_folder_is_one_line(script, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine\n")
    users = tmp_path / "mine"
    users.mkdir()
    (users / "checkpoint.safetensors").write_text("someone else's\n")
    before = tree_digest(tmp_path)
    rc, err = _run(script, file)
    assert rc == 2 and "is a file; choose a folder path" in assert_one_line_error(err), err
    rc, err = _run(script, users)
    assert rc == 2 and "was not created by" in assert_one_line_error(err), err
    assert tree_digest(tmp_path) == before  # nothing written, nothing reused
