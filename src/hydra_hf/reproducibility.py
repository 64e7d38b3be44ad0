"""Pinned threads and deterministic kernels: one run's numbers on every machine of a kind.

A model trained on a CPU depends on how many threads split its float reductions: the same seed trained
with one torch thread and with two gives different weights (a tiny ViT trained from scratch on the image
testbed moved by up to 5 AUROC points). torch takes its thread count from ``OMP_NUM_THREADS`` or, when
that is unset, from the machine's cores, so a script that does not set it explicitly reproduces only
on the machine and shell it ran in. :func:`pin_threads` fixes every such setting to values the script
chooses, never read from the environment, and returns what it set so the script can print it and
record it in its results file.

What stays machine-dependent: the instruction set the kernels dispatch to (a CPU with AVX-512 and one
without may round differently; ``MKL_CBWR`` fixes MKL's choice only when set before the process
starts) and bf16 training, which a script turns on only where the CPU multiplies bf16 natively.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .outputs import write_text_atomic

__all__ = [
    "DEFAULT_THREADS",
    "THREAD_ENV_VARS",
    "add_threads_argument",
    "command_line",
    "describe_machine",
    "describe_threads",
    "pin_threads",
    "seed_worker",
    "write_results_file",
]

logger = logging.getLogger(__name__)

DEFAULT_THREADS = 2
"""The torch intra-op thread count the scripts pin by default (the reference machine has 2 cores)."""

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS")
"""Thread counts of the BLAS / OpenMP runtimes, read when a process starts: set for child processes."""


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}; pass e.g. {name}=2")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}; pass a fixed thread count such as 2")
    return value


def pin_threads(
    num_threads: int = DEFAULT_THREADS, *, interop_threads: int = 1, deterministic: bool = True
) -> dict[str, Any]:
    """Fix the thread counts and kernel choices that make a run differ between machines of one kind.

    Sets torch's intra-op threads to ``num_threads`` and its inter-op threads to ``interop_threads``
    (torch allows the latter once per process, before any inter-op work: a later call logs a warning
    and the count in use is what it returns), exports the same counts to child processes
    (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and the other BLAS variables), turns the Rust tokenizers'
    parallelism off, and with
    ``deterministic`` asks torch for deterministic algorithms where it has them
    (``torch.use_deterministic_algorithms(True, warn_only=True)``; cuDNN deterministic, no benchmark
    autotuning, and the cuBLAS workspace setting deterministic GPU matmuls need).

    Args:
        num_threads: torch intra-op threads; a fixed number chosen by the script, never the machine's core count.
        interop_threads: torch inter-op threads.
        deterministic: also select deterministic kernels.

    Returns:
        What was set: ``{"torch_threads", "interop_threads", "env": {variable: value}, "deterministic"}``
        (JSON-ready; scripts write it into their results file). The same summary is logged on one line.
    """
    num_threads = _positive_int(num_threads, "num_threads")
    interop_threads = _positive_int(interop_threads, "interop_threads")
    env = {name: str(num_threads) for name in THREAD_ENV_VARS}
    env["TOKENIZERS_PARALLELISM"] = "false"
    if deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # read when CUDA initialises; needed by deterministic cuBLAS
    os.environ.update(env)
    torch.set_num_threads(num_threads)
    if torch.get_num_interop_threads() != interop_threads:
        try:
            torch.set_num_interop_threads(interop_threads)
        except RuntimeError:  # torch allows it once, before the first inter-op work; the count is recorded as it is
            logger.warning("torch already runs %d inter-op threads and cannot switch to %d now (call pin_threads "
                           "first thing in main()); inter-op threads run whole ops side by side and do not "
                           "change their numbers", torch.get_num_interop_threads(), interop_threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    if deterministic:
        # deterministic mode would also fill every new tensor (torch.empty) with NaN to expose reads of
        # uninitialised memory: a debugging aid that costs a write per allocation and changes no correct result
        torch.utils.deterministic.fill_uninitialized_memory = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing, i.e. by chance
    settings = {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "env": env,
        "deterministic": deterministic,
    }
    logger.info(describe_threads(settings))
    return settings


def describe_threads(settings: dict[str, Any]) -> str:
    """One line for a script's output: ``threads pinned: torch 2, interop 1, OMP/MKL 2, ...``."""
    env = settings["env"]
    return (
        f"threads pinned: torch {settings['torch_threads']}, interop {settings['interop_threads']}, "
        f"OMP/MKL {env['OMP_NUM_THREADS']}/{env['MKL_NUM_THREADS']}, tokenizers parallelism "
        f"{env['TOKENIZERS_PARALLELISM']}, deterministic algorithms {'on' if settings['deterministic'] else 'off'}"
    )


BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of native bf16 products, the first present named in :func:`describe_machine`."""


def describe_machine(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU a run's numbers belong to, for its results file: the model name, the vendor, family and model
    numbers (``cpuid``), the vector ISA torch's own kernels dispatch to, and which native bf16 products the CPU
    has (``amx_bf16``, ``avx512_bf16`` or ``None``). Pinned threads make a run repeat on machines with the same
    CPU kind; oneDNN and MKL pick other
    kernels on another CPU (AMX tiles or AVX-512 bf16 dot products, another blocking), so a run trained there
    differs by rounding, and a model trained from it further. ``cpuinfo``: the text of /proc/cpuinfo (read
    when not given; empty where the file does not exist)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    family = " ".join(f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model"))
                      if key in fields)
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "cpuid": " ".join(part for part in (fields.get("vendor_id", ""), family) if part) or None,
            "isa": torch.backends.cpu.get_cpu_capability(),
            "bf16_products": next((flag for flag in BF16_FLAGS if flag in flags), None)}


def command_line(script: str | os.PathLike, argv: Sequence[str] | None = None) -> str:
    """The command that reproduces a script's run, for its results file: ``python FOLDER/NAME.py ARGS`` (the
    script's folder and name, as run from the repository root; ``argv``: the arguments, default this process's),
    quoted for a shell."""
    script = Path(script)
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", f"{script.parent.name}/{script.name}", *args])


def write_results_file(results: dict[str, Any], path: str | os.PathLike | None, script: str | os.PathLike,
                       argv: Sequence[str] | None = None) -> str:
    """A script's results file: ``results`` with ``command`` (:func:`command_line` of ``script`` and ``argv``)
    and ``machine`` (:func:`describe_machine`, unless ``results`` holds one) as indented strict JSON, written
    atomically to ``path`` (its folder created) when one is given; returns the text (scripts print it)."""
    results["command"] = command_line(script, argv)
    results.setdefault("machine", describe_machine())
    text = json.dumps(results, indent=1, default=str, allow_nan=False) + "\n"
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(path), text)
    return text


def add_threads_argument(parser: argparse.ArgumentParser, default: int = DEFAULT_THREADS) -> None:
    """``--threads N``: the fixed torch thread count a script pins (:func:`pin_threads`)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=default,
        help=f"torch threads, pinned whatever the environment or the machine says (default {default}): "
        "float reductions depend on the count",
    )


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for a DataLoader: seed Python's and NumPy's RNGs in each worker from the seed
    torch gave that worker (the loader's ``generator`` + ``worker_id``), so worker-side randomness
    repeats with the loader's generator. Harmless with ``num_workers=0``, where it is never called."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)
