"""Shared benchmark utilities: timing side by side in one process, matmul peak, FLOP counting.

Speed claims of hydra_hf live here, never in timed unit tests. Every benchmark measures all of its
contenders in the same process, interleaved over rounds, and reports medians and ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hydra_hf.outputs import write_text_atomic
from hydra_hf.reproducibility import add_threads_argument, command_line, describe_threads, pin_threads


def median_ms(fn: Callable[[], object], *, warmup: int = 2, repeats: int = 7) -> float:
    """Median wall time of ``fn()`` in milliseconds (inference mode, after ``warmup`` calls)."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def interleaved_medians(contenders: dict[str, Callable[[], object]], *, rounds: int = 5, repeats: int = 3,
                        warmup: int = 2) -> dict[str, float]:
    """Median ms per contender, measured round-robin so that drift in machine load hits all alike."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.inference_mode():
        for fn in contenders.values():
            for _ in range(warmup):
                fn()
        for _ in range(rounds):
            for name, fn in contenders.items():
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """This machine's fp32 matmul throughput (GFLOP/s): the best of ``repeats`` ``n x n`` products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    with torch.inference_mode():
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def count_matmul_macs(fn: Callable[[], object]) -> int:
    """Multiply-accumulates of all matrix products run by ``fn()``, counted by torch's FlopCounter
    (which reports FLOPs = 2 x MACs)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops() // 2


def table(rows: list[dict], columns: list[str]) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) in ``columns`` order."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "–")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------ Single / Deep / Naive / Hydra
NAMES = {"single": "Single", "deep": "Deep Ensemble (3)", "naive": "Naive members (3)", "fused": "Hydra fused (3)"}
COLUMNS = ["batch", "model", "latency_ms", "x Single", "x Deep", "x Naive", "params_M", "GMACs", "GFLOP/s",
           "% of matmul peak"]


def random_kept_heads(num_members: int, num_layers: int, num_heads: int, keep: int, seed: int = 0) -> list:
    """``kept[m][l]``: ``keep`` random heads of ``num_heads`` per member and layer (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return [
        [sorted(torch.randperm(num_heads, generator=g)[:keep].tolist()) for _ in range(num_layers)]
        for _ in range(num_members)
    ]


def group_parameters(group) -> int:
    return sum(count_parameters(m) for m in group) if isinstance(group, list) else count_parameters(group)


def compare_contenders(models: dict, inputs_for_batch: Callable[[int], dict], batch_sizes: list[int], *,
                       device: str = "cpu", rounds: int = 5, repeats: int = 2, warmup: int = 2) -> list[dict]:
    """Time ``models`` (``{"single", "deep", "naive", "fused"}``: a model or a list run one after
    another) side by side on the inputs of each batch size; one row per model and batch size."""
    peak = matmul_peak_gflops() if device == "cpu" else float("nan")
    rows = []
    for batch in batch_sizes:
        inputs = inputs_for_batch(batch)

        def call(group):
            if isinstance(group, list):
                return lambda: [m(**inputs).logits for m in group]
            return lambda: group(**inputs).logits

        fns = {name: call(group) for name, group in models.items()}
        sync = (lambda: torch.cuda.synchronize()) if device == "cuda" else (lambda: None)
        timed = {name: (lambda f=f: (f(), sync())) for name, f in fns.items()}
        ms = interleaved_medians(timed, rounds=rounds, repeats=repeats, warmup=warmup)
        for name, group in models.items():
            macs = count_matmul_macs(fns[name])
            gflops = 2 * macs / (ms[name] * 1e-3) / 1e9
            rows.append(
                {
                    "batch": batch,
                    "model": NAMES[name],
                    "latency_ms": ms[name],
                    "x Single": ms[name] / ms["single"],
                    "x Deep": ms[name] / ms["deep"],
                    "x Naive": ms[name] / ms["naive"],
                    "params_M": group_parameters(group) / 1e6,
                    "GMACs": macs / 1e9,
                    "GFLOP/s": gflops,
                    "% of matmul peak": 100 * gflops / peak,
                }
            )
    return rows


def summary_lines(rows: list[dict]) -> list[str]:
    """One line per batch size with the ratios the targets are stated in."""
    lines = []
    for batch in sorted({r["batch"] for r in rows}):
        r = {row["model"]: row for row in rows if row["batch"] == batch}
        fused = r[NAMES["fused"]]
        lines.append(f"batch {batch}: Hydra/Deep = {fused['x Deep']:.2f}, Hydra/Naive = {fused['x Naive']:.2f}, "
                     f"Hydra/Single = {fused['x Single']:.2f}, params Hydra/Single = "
                     f"{fused['params_M'] / r[NAMES['single']]['params_M']:.2f}")
    return lines


def pin_bench_threads(threads: int) -> dict:
    """Pin torch's threads to the bench's fixed ``--threads`` (never the machine's core count) and print it;
    the default kernels stay (the deterministic ones may time differently). Returns the settings for the JSON."""
    settings = pin_threads(threads, deterministic=False)
    print(describe_threads(settings))
    return settings


def add_timing_args(parser, rounds: int = 5, repeats: int = 2) -> None:
    add_threads_argument(parser)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the thread settings and the rows to this JSON file")


def write_results(path: str | Path, threads: dict, **fields: Any) -> dict:
    """Write a benchmark's results file (atomically): the command that reproduces it (this process's own
    ``python bench/NAME.py ARGS``), torch's version, the machine's core count and load average when it ended,
    the thread settings and ``fields`` (the rows, targets, ...). Returns what was written."""
    results = {
        "command": command_line(sys.argv[0]),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "threads": threads,
        **fields,
    }
    results = _finite(results)
    write_text_atomic(path, json.dumps(results, indent=2, allow_nan=False) + "\n")
    return results


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (a cell that does not apply, e.g. a file size of an eager
    model) replaced by None: JSON has no NaN, and the rendered table shows None as '–'."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
