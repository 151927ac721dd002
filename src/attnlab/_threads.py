"""As many threads as the machine has free cores: attnlab's heavy calls on a busy machine.

torch runs every operator on all its intra-op threads (one per core by default) and ends
each one at a barrier. When other processes keep the cores busy, the OS deschedules one
of those threads for a whole time slice (milliseconds) and every other thread waits for it
at the next barrier; code made of many short operators (a decoding step, the encoder's
padding-free path, block-sparse attention's chunks) then spends most of its time waiting.
Measured on a 2-core AMD EPYC with two other busy processes, such code lost 3-11x where
HuggingFace's (fewer, larger operators) lost 4.5x.

:func:`threads_for_load` gives the call as many threads as there are cores the other
processes leave free (at least one, at most what torch was set to): with one thread there
is no barrier to wait at. It reads the machine's CPU time from ``/proc/stat`` (Linux) at
most every :data:`SAMPLE_SECONDS` and subtracts this process's own; before a first interval
exists it counts the runnable tasks in ``/proc/loadavg``. Elsewhere, or with
``ATTNLAB_THREADS=fixed`` (read by :mod:`attnlab._dispatch`), torch's setting is left as it is.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator, Optional

import torch

from ._dispatch import threads_adaptive
from ._machine import CpuSample, cpu_count, cpu_sample, others_busy
from ._moved import moved_names

__all__ = ["SAMPLE_SECONDS", "free_cores", "threads_for_load"]

SAMPLE_SECONDS = 0.5
"""The shortest interval over which the other processes' CPU time is measured."""

def _runnable_others() -> Optional[int]:
    """Tasks runnable right now on the machine besides this call's own thread."""
    try:
        with open("/proc/loadavg") as loadavg:
            running = int(loadavg.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(running - 1, 0)


def free_cores(previous: CpuSample, now: CpuSample, cores: int) -> float:
    """Cores the other processes left free between two samples."""
    return min(max(cores - others_busy(previous, now), 0.0), float(cores))


class _LoadWatch:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sample: Optional[CpuSample] = None
        self._free: Optional[float] = None

    def free(self, cores: int) -> Optional[float]:
        with self._lock:
            now_wall = time.monotonic()
            if self._sample is None or now_wall - self._sample.wall >= SAMPLE_SECONDS:
                sample = cpu_sample()
                if sample is None:
                    return None
                if self._sample is not None:
                    self._free = free_cores(self._sample, sample, cores)
                self._sample = sample
            if self._free is not None:
                return self._free
        others = _runnable_others()
        return None if others is None else float(max(cores - others, 0))


_WATCH = _LoadWatch()


def threads_for(requested: int, free: Optional[float]) -> int:
    """The threads to run on: ``requested``, or fewer where fewer cores are free (at least 1)."""
    if free is None:
        return requested
    return max(1, min(requested, int(free + 0.5)))


@contextlib.contextmanager
def threads_for_load() -> Iterator[int]:
    """Inside the block torch runs on as many threads as the machine has free cores
    (see the module notes); yields that number. torch's setting comes back at the end."""
    requested = torch.get_num_threads()
    if not threads_adaptive() or requested == 1:
        yield requested
        return
    chosen = threads_for(requested, _WATCH.free(cpu_count()))
    if chosen == requested:
        yield requested
        return
    torch.set_num_threads(chosen)
    try:
        yield chosen
    finally:
        torch.set_num_threads(requested)


__getattr__ = moved_names(__name__)  # adaptive: attnlab._dispatch.threads_adaptive
