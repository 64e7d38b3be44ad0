"""Running evaluation across processes (``accelerate launch --num_processes N -m hydra_hf.cli evaluate``).

Every data set is split into N contiguous runs of whole batches, one per process: process r predicts
exactly the batches that one process would have predicted at those positions (same examples, same
padding, and -- for MC Dropout -- the same dropout seeds, see :func:`hydra_hf.evaluation.predict`).
The predictions are gathered in rank order, so every process holds the predictions of the whole data
set, in its order, each example once, equal to one process's. The metrics are then computed on
identical tensors everywhere, and only the main process writes files.

Outside a launcher (no ``WORLD_SIZE`` > 1 in the environment) everything here is a no-op, and
``accelerate`` is not even imported.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from accelerate import PartialState


@dataclass(frozen=True)
class ProcessInfo:
    num_processes: int = 1
    process_index: int = 0

    @property
    def is_main(self) -> bool:
        return self.process_index == 0

    @property
    def distributed(self) -> bool:
        return self.num_processes > 1


@functools.cache
def process_info() -> ProcessInfo:
    """This process's place among the launched ones (initialises the process group when launched)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return ProcessInfo()

    # `accelerate launch --multi_gpu` on a machine without GPUs: CPU processes over gloo
    no_gpu = not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available())
    state = PartialState(cpu=no_gpu)
    if state.num_processes != int(os.environ["WORLD_SIZE"]):
        raise RuntimeError(
            f"launched as {os.environ['WORLD_SIZE']} processes but Accelerate set up {state.num_processes} "
            f"({state.distributed_type}); check the `accelerate launch` options for this machine"
        )
    return ProcessInfo(state.num_processes, state.process_index)


@dataclass(frozen=True)
class BatchShard:
    """Process ``index`` of ``count`` predicts batches ``[first_batch, end_batch)`` of ``total_batches``."""

    first_batch: int
    end_batch: int
    total_batches: int


def batch_shard(num_examples: int, batch_size: int, info: ProcessInfo | None = None) -> BatchShard:
    """The contiguous run of whole batches this process predicts (all of them in one process)."""
    info = info or process_info()
    total = -(-num_examples // batch_size)
    first = total * info.process_index // info.num_processes
    end = total * (info.process_index + 1) // info.num_processes
    return BatchShard(first, end, total)


def shard(dataset: Any, batch_size: int) -> tuple[Any, BatchShard]:
    """This process's examples of ``dataset`` (whole batches of ``batch_size``) and which batches they are."""
    part = batch_shard(len(dataset), batch_size)
    if part.first_batch == 0 and part.end_batch == part.total_batches:
        return dataset, part
    return dataset.select(range(part.first_batch * batch_size, min(part.end_batch * batch_size, len(dataset)))), part


def gather_rows(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """Concatenate every process's rows in rank order (shards may differ in length, or be empty: None)."""
    info = process_info()
    if not info.distributed:
        return tensor

    parts: list[Any] = [None] * info.num_processes
    dist.all_gather_object(parts, None if tensor is None else tensor.cpu())
    present = [p for p in parts if p is not None]
    return torch.cat(present) if present else None


def barrier() -> None:
    if process_info().distributed:
        dist.barrier()
