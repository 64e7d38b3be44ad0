"""Helpers for the hostile-input tests: run the CLI, check its one-line errors, digest folders."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path


def run_cli(args: list[str], *, fresh: bool = False, timeout: int = 600) -> tuple[int, str, str]:
    """Run ``hydra-hf ARGS``; returns ``(exit code, stdout, stderr)``.

    In this process by default (fast); ``fresh=True`` runs ``python -m hydra_hf.cli`` in a new one.
    """
    if fresh or "-v" in args:
        proc = subprocess.run([sys.executable, "-m", "hydra_hf.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdin=subprocess.DEVNULL)
        return proc.returncode, proc.stdout, proc.stderr
    from hydra_hf.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse errors
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def assert_one_line_error(stderr: str) -> str:
    """The CLI's error message: exactly one ``hydra-hf CMD: error: ...`` line and no traceback."""
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert "Traceback" not in stderr, f"a traceback instead of one line:\n{stderr[-3000:]}"
    assert len(lines) == 1, f"expected one error line, got:\n{stderr[-3000:]}"
    return lines[0]


def tree_digest(root: str | os.PathLike, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Path -> sha256 (or link target) of everything under ``root``, symlinks not followed."""
    root = Path(root)
    digest: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if any(rel == e or rel.startswith(e.rstrip("/") + "/") for e in exclude):
                continue
            if path.is_symlink():
                digest[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                digest[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                digest[rel] = "dir"
    return digest
