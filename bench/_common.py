"""Shared benchmark utilities: timing side by side in one process, matmul peak, FLOP counting.

Speed claims of hydra_hf live here, never in timed unit tests. Every benchmark measures all of its
contenders in the same process, interleaved over rounds, and reports medians and ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


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


def matmul_peak_gflops(n: int = 1024, repeats: int = 5) -> float:
    """This machine's measured fp32 matmul throughput (GFLOP/s) on ``n x n`` products."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    ms = median_ms(lambda: a @ b, warmup=2, repeats=repeats)
    return 2 * n**3 / (ms * 1e-3) / 1e9


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
