"""`hydra-hf --help` / `--version`: every flag of every command explains itself, every command shows an example."""

from __future__ import annotations

import argparse

import pytest

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
