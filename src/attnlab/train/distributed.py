"""Several processes through ``torchrun``: process-group set-up and helpers.

``torchrun`` starts one process per worker and tells each its rank through the
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), which
``init_process_group`` reads. Only the command line calls :func:`init_distributed`;
the trainer only asks ``torch.distributed`` whether a group exists.
"""

from __future__ import annotations

import gc
import os
from typing import NamedTuple

import torch
import torch.distributed as dist

__all__ = [
    "DistributedInfo", "distributed_info", "init_distributed", "shutdown_distributed", "all_reduce_mean",
    "any_process",
]


class DistributedInfo(NamedTuple):
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_info() -> DistributedInfo:
    """This process's rank and the number of processes (``(0, 1, 0)`` without a group)."""
    if dist.is_available() and dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        return DistributedInfo(dist.get_rank(), dist.get_world_size(), local_rank)
    return DistributedInfo(0, 1, 0)


def init_distributed() -> DistributedInfo:
    """Join the process group when started by ``torchrun`` with more than one process:
    gloo on CPU, nccl on GPU. A single process stays ungrouped."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return distributed_info()


def shutdown_distributed(wait_for_others: bool = True) -> None:
    """Leave the process group, as the last distributed call of a process.

    A finished ``DistributedDataParallel`` wrapper is garbage in a reference cycle, which
    only the cycle collector frees; left to the interpreter's exit, its gloo connections
    were torn down there and could abort the process (``terminate called without an
    active exception``, seen in a two-process run that had finished its work). So the
    collector runs first, while the group is alive. Then, by default, every process
    waits at a barrier, so none leaves while another is still finishing (process 0
    writing the last files, say). A process leaving on an error passes
    ``wait_for_others=False``: the others would never reach the barrier."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        if wait_for_others:
            dist.barrier()
        dist.destroy_process_group()


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """The mean of ``value`` over all processes (``value`` itself without a group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / dist.get_world_size()


def any_process(value: int) -> int:
    """The largest of every process's ``value`` (``value`` itself without a group): a
    non-zero flag raised by one process reaches all of them."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
