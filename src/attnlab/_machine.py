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
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

__all__ = ["CpuSample", "busy_now", "competing_load", "cpu_count", "cpu_name", "cpu_sample", "load_average",
           "machine_line", "others_busy"]

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

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
    """The CPU's model name with its family and model numbers (Linux; a virtual machine's
    short name such as "AMD EPYC" says little without them), else what ``platform`` says;
    and torch's vector capability."""
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as info:
            fields: dict[str, str] = {}
            for line in info:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        if "model name" in fields:
            name = f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    return f"{name}, {torch.backends.cpu.get_cpu_capability()}"


@dataclass(frozen=True)
class CpuSample:
    """The machine's CPU time at one moment (Linux's ``/proc/stat``)."""

    wall: float  # time.monotonic()
    busy_ticks: int  # every core's non-idle time since boot, in clock ticks (steal included)
    own_seconds: float  # this process's CPU time


def cpu_sample() -> Optional[CpuSample]:
    """The machine's CPU time now; ``None`` where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return CpuSample(time.monotonic(), busy, time.process_time())


def others_busy(previous: CpuSample, now: CpuSample) -> float:
    """Cores the other processes kept busy, on average, between two samples."""
    seconds = max(now.wall - previous.wall, 1e-9)
    others = (now.busy_ticks - previous.busy_ticks) / _TICKS - (now.own_seconds - previous.own_seconds)
    return max(others / seconds, 0.0)


def busy_now(seconds: float = 1.0) -> Optional[float]:
    """Cores the other processes keep busy, measured over the next ``seconds``."""
    first = cpu_sample()
    if first is None:
        return None
    time.sleep(seconds)
    second = cpu_sample()
    return None if second is None else others_busy(first, second)


def load_average() -> Optional[float]:
    """The one-minute load average, ``None`` where the OS has none (Windows)."""
    with contextlib.suppress(AttributeError, OSError):
        return os.getloadavg()[0]
    return None


def machine_line(competing: int = 0) -> str:
    """One line for a benchmark's output: CPU, cores, torch threads and how busy the machine
    is (measured over one second now, and the load average).

    ``competing``: busy processes this run started itself (``--load``), which the load
    average takes a minute to show.
    """
    load, busy, cores = load_average(), busy_now(), cpu_count()
    if competing:
        state = f"{competing} competing busy process{'es' if competing > 1 else ''} started by --load"
    elif busy is None:
        state = "load unknown"
    else:
        state = "idle" if busy < 0.25 else "busy"
    measured = [] if busy is None else [f"other processes busy on {busy:.1f} of {cores} cores"]
    measured += [] if load is None else [f"load average {load:.2f}"]
    return (f"CPU: {cpu_name()}; {cores} cores, {torch.get_num_threads()} torch threads; "
            f"{', '.join(measured + [state])}")


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
