"""`hydra-hf`: a thin command line over the library API.

Each sub-command lives in its own module of this package and exposes ``add_parser(subparsers)``,
which registers its arguments and sets ``func`` (called with the parsed ``argparse.Namespace``).
Errors caused by the user (:class:`hydra_hf.errors.HydraError`, and the ``ValueError``,
``FileNotFoundError``, ``FileExistsError`` that libraries raise for bad input), and a full disk or a
read-only filesystem met while writing, become a one-line message on stderr and exit code 2; ``-v``
shows the traceback too. Anything else keeps its traceback.
:func:`run_script` gives the example scripts the same contract.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HydraError, one_line
from ..progress import set_progress_bars
from ..version import __version__

PROG = "hydra-hf"
DESCRIPTION = (
    "Hydra Ensembles for Hugging Face transformers: prune, convert, fine-tune, calibrate, evaluate, aggregate, "
    "export, push, serve."
)
# Sub-command modules, in the order `hydra-hf --help` lists them. The console script (hydra_hf_cli, outside
# the package so that `--help` and `--version` need no torch) prints a copy of this top level;
# tests/cli/test_cli_help.py checks that the two helps are equal.
COMMANDS = ("prune", "convert", "finetune", "calibrate", "evaluate", "aggregate", "export", "push", "serve")
# the commands that load models or data: each takes --no-progress
LONG_COMMANDS = ("prune", "convert", "finetune", "evaluate", "export", "push")

# One worked example per command, shown at the end of `hydra-hf COMMAND --help`.
EXAMPLES = {
    "prune": """example (3 CircAvg members of a fine-tuned text classifier, 36 heads removed each):
  hydra-hf prune --model runs/single --method circuit-avg --members 3 --remove 36 --seed 0 \\
      --id-data rotten_tomatoes:validation --ood-data guardian_headlines:ood_validation --output masks.json""",
    "convert": """example (fuse the members of masks.json, all starting from one checkpoint):
  hydra-hf convert --base runs/single --masks masks.json --output hydra-rt""",
    "finetune": """example (fine-tune every member with the text recipe, then fuse):
  hydra-hf finetune --model runs/single --masks masks.json --train-data rotten_tomatoes:train \\
      --eval-data rotten_tomatoes:validation --output hydra-rt-ft""",
    "calibrate": """example (90% LAC sets; abstain to keep the error among answered inputs at most 5%; held-out data:
the training reviews after the first 6,000, which the README's recipes never train on):
  hydra-hf calibrate hydra-rt --data "rotten_tomatoes:train[6000:]" --alpha 0.1 --risk 0.05 --output hydra-rt-cal""",
    "evaluate": """example (Hydra against the single model, with temperature scaling, on two OOD sets):
  hydra-hf evaluate --model hydra-rt --baseline Single=runs/single --temperature-scaling \\
      --val-data rotten_tomatoes:validation --id-data rotten_tomatoes:test \\
      --ood-data guardian_headlines:ood_test --ood-data presidential_debates:ood_test --report report""",
    "aggregate": """example (three seeds of one pipeline: mean ± std of every number, each seed's intervals):
  hydra-hf aggregate runs/seed0/report runs/seed1/report runs/seed2/report --output report-3-seeds""",
    "export": """example (an int8 ONNX graph, with its accuracy against fp32 on validation and OOD data):
  hydra-hf export hydra-rt --format onnx --quantize int8 --output hydra-rt-onnx \\
      --calibration-data rotten_tomatoes:validation --ood-data guardian_headlines:ood_validation
then: hydra-hf evaluate --model hydra-rt-onnx --baseline "ONNX fp32=hydra-rt-onnx/model.onnx" \\
      --baseline PyTorch=hydra-rt --id-data rotten_tomatoes:test --ood-data guardian_headlines:ood_test --report r""",
    "push": """example (stage and validate without uploading):
  hydra-hf push hydra-rt --repo-id my-org/hydra-minilm-rt --report report --dry-run""",
    "serve": """example (2 replicas, batches of up to 32 texts, on this machine only):
  hydra-hf serve hydra-rt --replicas 2 --max-batch-size 32 --port 8000
then: curl -s localhost:8000/predict -d '{"inputs": ["a gripping film", "dull"]}'""",
}


# kept for callers of the earlier name
HydraUserError = HydraError

# what a user's bad input raises inside the libraries we call (safetensors, json, torch.load, ...)
USER_ERRORS = (HydraError, ValueError, FileNotFoundError, FileExistsError, NotADirectoryError,
               IsADirectoryError, PermissionError)
# the machine's state, not a bug: a full disk or quota, a read-only filesystem, a file too large for it
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def _is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, USER_ERRORS) or (isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS)


def _message(exc: BaseException) -> str:
    """The one line of ``exc``; a full or read-only disk also says what to do (outputs are written
    atomically, so nothing half-written was left)."""
    if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS and not isinstance(exc, HydraError):
        # a copy or a rename names its source first and the file being written second (filename2)
        written = exc.filename2 or exc.filename
        where = f" writing {written!r}" if written else ""
        return (f"{exc.strerror or one_line(exc)}{where}; free some space (or write to another filesystem) and "
                "run again: nothing half-written was left")
    return one_line(exc)


def finite_float(text: str) -> float:
    """The ``type=`` of every float flag: a finite number (``nan`` and ``inf`` pass ``float()`` and every
    range check written as ``value < minimum``, then poison a run)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give a finite value")
    return value


def positive_int(text: str) -> int:
    """The ``type=`` of every count flag (a batch size, a number of examples, tokens, samples, classes ...): a
    whole number >= 1 (0 and negatives pass ``int()`` and then crash a run, e.g. ``--batch-size 0`` divided by
    zero after the model was loaded)."""
    return _whole(text, 1, "a positive whole number, e.g. 32")


def non_negative_int(text: str) -> int:
    """The ``type=`` of count flags where 0 means none (``--bootstrap 0``, ``--members 0``, ``--remove 0``) and
    of seeds: a whole number >= 0."""
    return _whole(text, 0, "a whole number >= 0")


def _whole(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give {expected}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} is less than {minimum}; give {expected}")
    return value


def top_parser() -> argparse.ArgumentParser:
    """The top level of ``hydra-hf``: description, ``-v``, ``--version`` (no sub-commands yet)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the hydra-hf version and exit")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"hydra_hf.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"hydra_hf.cli.{name}":
                continue  # sub-command not part of this build
            raise
        module.add_parser(sub)
        command = sub.choices[name]
        if name in LONG_COMMANDS and "--no-progress" not in command._option_string_actions:
            command.add_argument("--no-progress", action="store_true",
                                 help="no progress bars (hydra-hf's, transformers', datasets')")
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        if name in EXAMPLES and not command.epilog:
            command.epilog = EXAMPLES[name]
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
    set_progress_bars(not getattr(args, "no_progress", False))
    try:
        result = args.func(args)
    except (*USER_ERRORS, OSError) as exc:
        if not _is_user_error(exc):  # another OSError: a bug or the machine, keep its traceback
            raise
        if args.verbose:
            logging.getLogger("hydra_hf.cli").exception("%s failed", args.command)
        print(f"hydra-hf {args.command}: error: {_message(exc)}", file=sys.stderr)
        return 2
    return int(result or 0)


def run_script(script_main: Callable[[], Any]) -> None:
    """Run an example script's ``main`` with the commands' error contract: a user's bad input
    (:data:`USER_ERRORS`) exits 2 with one line (``HYDRA_HF_TRACEBACK=1`` shows the traceback);
    an ``int`` that ``main`` returns is the exit status; any other return value (a recipe's result, for
    callers of ``main``) is success."""
    try:
        code = script_main()
    except (*USER_ERRORS, OSError) as exc:
        if os.environ.get("HYDRA_HF_TRACEBACK") or not _is_user_error(exc):
            raise
        print(f"{Path(sys.argv[0]).name}: error: {_message(exc)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


if __name__ == "__main__":
    sys.exit(main())
