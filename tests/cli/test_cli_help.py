"""`hydra-hf --help` / `--version`: every flag of every command explains itself, every command shows an example."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import hydra_hf_cli
from hydra_hf import __version__
from hydra_hf.cli import COMMANDS, build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_and_the_command_an_example(command):
    sub = _subparsers(build_parser())[command]
    missing = [a.option_strings or [a.dest] for a in sub._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert missing == [], f"hydra-hf {command}: flags without help text: {missing}"
    text = sub.format_help()
    assert f"hydra-hf {command} " in text.split("example", 1)[-1], f"hydra-hf {command} --help shows no worked example"


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"hydra-hf {__version__}"


def test_the_console_script_answers_version_and_help_without_importing_torch():
    """Issue 24 item 9: `hydra-hf --version` / `--help` imported torch (~6 s). The entry point pyproject.toml
    installs, run in a new interpreter, prints them with neither torch nor hydra_hf imported."""
    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["hydra-hf"].partition(":")
    code = (f"import sys\nfrom {module} import {function} as main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('imported:', sorted(m for m in ('torch', 'transformers', 'hydra_hf') if m in sys.modules))")
    for flag, expected in (("--version", f"hydra-hf {__version__}"), ("--help", "usage: hydra-hf")):
        out = subprocess.run(
            [sys.executable, "-c", code, flag], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        assert expected in out and out.strip().endswith("imported: []"), out


def test_the_fast_help_is_the_full_parsers_help(capsys):
    """The console script's own top-level help (hydra_hf_cli.COMMANDS) equals the full parser's."""
    with pytest.raises(SystemExit) as exc:
        hydra_hf_cli.main(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == build_parser().format_help()
    assert hydra_hf_cli.main([]) == 2 and capsys.readouterr().out == build_parser().format_help()
