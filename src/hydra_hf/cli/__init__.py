"""`hydra-hf`: a thin command line over the library API.

Each sub-command lives in its own module of this package and exposes ``add_parser(subparsers)``,
which registers its arguments and sets ``func`` (called with the parsed ``argparse.Namespace``).
Library errors meant for the user (``ValueError``, ``FileNotFoundError``, ``FileExistsError``,
``HydraUserError``) become a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Sub-command modules, in the order `hydra-hf --help` lists them.
COMMANDS = ("prune", "convert", "finetune", "evaluate", "push")


class HydraUserError(Exception):
    """An error caused by the user's input; the CLI prints it as one line."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hydra-hf",
        description="Hydra Ensembles for Hugging Face transformers: prune, convert, fine-tune, evaluate, push.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"hydra_hf.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"hydra_hf.cli.{name}":
                continue  # sub-command not part of this build
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, HydraUserError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"hydra-hf {args.command}: error: {msg}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
