"""The machine a measurement ran on: its CPU, how busy it was, and a competing load on demand.

Speed ratios hold for one kind of CPU and one load: every benchmark prints
:func:`machine_line` beside its figures, and ``--load N`` (:func:`competing_load`) starts
``N`` busy processes for the length of a run, so that "with the cores shared" is measured
the same way each time.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
from typing import Iterator, Optional

import torch

__all__ = ["competing_load", "cpu_count", "cpu_name", "load_average", "machine_line"]

# A busy process: spins until its deadline, or until the process that started it is gone
# (checked every ~0.1 s), so that a killed benchmark never leaves it behind.
_SPIN = """
import os, sys, time
deadline, parent = float(sys.argv[1]), int(sys.argv[2])
while time.monotonic() < deadline and os.getppid() == parent:
    end = time.monotonic() + 0.1
    while time.monotonic() < end:
        pass
"""


def cpu_count() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name (Linux), else what ``platform`` says, and torch's vector capability."""
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
        name = names[0] if names else name
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


def load_average() -> Optional[float]:
    """The one-minute load average, ``None`` where the OS has none (Windows)."""
    with contextlib.suppress(AttributeError, OSError):
        return os.getloadavg()[0]
    return None


def machine_line(competing: int = 0) -> str:
    """One line for a benchmark's output: CPU, cores, torch threads and how busy the machine is.

    ``competing``: busy processes this run started itself (``--load``), which the load
    average takes a minute to show.
    """
    load = load_average()
    cores = cpu_count()
    if competing:
        state = f"{competing} competing busy process{'es' if competing > 1 else ''} started by --load"
    elif load is None:
        state = "load unknown"
    else:
        state = "idle" if load < 0.5 * cores else "busy"
    load_text = "" if load is None else f"load average {load:.2f}, "
    return (f"CPU: {cpu_name()}; {cores} cores, {torch.get_num_threads()} torch threads; "
            f"{load_text}{state}")


@contextlib.contextmanager
def competing_load(processes: int, max_seconds: float = 3600.0) -> Iterator[list[subprocess.Popen]]:
    """``processes`` busy processes (one pure-Python spin loop each) for the ``with`` block;
    yields them.

    Each stops by itself after ``max_seconds`` or when this process exits, and all are
    stopped when the block ends.
    """
    if processes < 0:
        raise ValueError(f"competing load: {processes} processes; give 0 or more")
    if processes == 0:
        yield []
        return
    deadline = time.monotonic() + max_seconds
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(deadline), str(os.getpid())])
                for _ in range(processes)]
    try:
        time.sleep(0.2)  # let them start spinning before the first timing
        yield spinners
    finally:
        for spinner in spinners:
            spinner.terminate()
        for spinner in spinners:
            spinner.wait()
