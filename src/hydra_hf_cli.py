"""The ``hydra-hf`` console script: ``hydra-hf --version`` and ``hydra-hf --help`` answer here, in
milliseconds; every other call runs :func:`hydra_hf.cli.main`.

This module sits outside the ``hydra_hf`` package on purpose: importing anything under ``hydra_hf``
runs ``hydra_hf/__init__.py``, which registers the Hydra classes with transformers' Auto classes and
so imports transformers and torch (about 6 s on a 2-core machine). The top-level help and the version
need neither. This module keeps a copy of the top level that :mod:`hydra_hf.cli` builds (its
description, flags and the one line of each command), and ``tests/cli/test_cli_help.py`` checks that the
help printed here equals the full parser's, so :data:`COMMANDS` cannot drift from the commands' own
``help=``. Only this module imports the other (:func:`main` hands every command to
:func:`hydra_hf.cli.main`, imported there: it costs torch).
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

PROG = "hydra-hf"
DESCRIPTION = (
    "Hydra Ensembles for Hugging Face transformers: prune, convert, fine-tune, calibrate, evaluate, aggregate, "
    "export, push, serve."
)
# Sub-commands, in the order `hydra-hf --help` lists them, with the one line it shows for each (the
# `help=` of each command's `add_parser` in hydra_hf/cli/<command>.py).
COMMANDS = {
    "prune": "choose the heads every member keeps (Taylor / circuits / random) and write masks.json",
    "convert": "fuse pruned members into one Hydra Ensemble model folder",
    "finetune": "fine-tune the pruned members on a task, then fuse them",
    "calibrate": "fit conformal prediction sets and a risk-controlled abstention threshold into a copy of a folder",
    "evaluate": "evaluate calibration and OOD detection against baselines",
    "aggregate": "average several seeds' evaluation reports (mean ± std)",
    "export": "export a Hydra folder for deployment (ONNX, optionally int8)",
    "push": "publish a Hydra Ensemble folder to the Hub (model card, validation, one commit)",
    "serve": "serve a folder over HTTP with its uncertainty (Ray Serve, dynamic batching)",
}
# a call made only of these top-level flags is answered here
_TOP_FLAGS = ("-h", "--help", "--version", "-v", "--verbose")


def version() -> str:
    """The installed hydra-hf version (its distribution metadata: no import of hydra_hf)."""
    try:
        return metadata.version("hydra-hf")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from hydra_hf.version import __version__  # imports the package (torch): a source tree only

        return __version__


def top_parser() -> argparse.ArgumentParser:
    """The top level of ``hydra-hf``: description, ``-v``, ``--version`` (no sub-commands yet)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print the hydra-hf version and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hydra-hf`` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    if all(arg in _TOP_FLAGS for arg in args):  # the help, the version, or no command
        parser = top_parser()
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        for name, summary in COMMANDS.items():
            sub.add_parser(name, help=summary)
        parser.parse_args(args)  # prints the help or the version and exits 0
        parser.print_help()  # no command at all: as hydra_hf.cli.main, the help and exit status 2
        return 2
    from hydra_hf.cli import main as run_command  # imports torch: only for a command

    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
