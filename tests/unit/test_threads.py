"""attnlab._threads: the number of threads a heavy call gets on a busy machine, and
attnlab._machine's competing load that benchmarks measure it with."""

from __future__ import annotations

import time

import pytest
import torch

from attnlab import _machine, _threads
from attnlab._machine import CpuSample
from attnlab._threads import free_cores, threads_for, threads_for_load


def test_free_cores_subtracts_this_process_s_own_time():
    ticks = _machine._TICKS
    before = CpuSample(wall=10.0, busy_ticks=0, own_seconds=1.0)
    # 1 s: the machine was busy 1.5 core-seconds, 0.5 of them this process's own
    after = CpuSample(wall=11.0, busy_ticks=int(1.5 * ticks), own_seconds=1.5)
    assert free_cores(before, after, cores=2) == pytest.approx(1.0)
    # every core busy with others, and more runnable than cores: none free (never negative)
    flooded = CpuSample(wall=11.0, busy_ticks=2 * ticks, own_seconds=1.0)
    assert free_cores(before, flooded, cores=2) == 0.0
    idle = CpuSample(wall=11.0, busy_ticks=0, own_seconds=1.0)
    assert free_cores(before, idle, cores=2) == 2.0


@pytest.mark.parametrize("requested,free,expected", [
    (2, None, 2),  # no measurement (not Linux): torch's setting
    (2, 2.0, 2), (2, 1.2, 1), (2, 0.0, 1),  # at least one thread
    (8, 5.6, 6), (4, 16.0, 4),  # never more than torch was set to
])
def test_threads_for_the_free_cores(requested, free, expected):
    assert threads_for(requested, free) == expected


def test_the_block_runs_on_the_free_cores_and_restores_torch_s_setting(monkeypatch):
    start = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(_threads._WATCH, "free", lambda cores: 0.3)
        with threads_for_load() as chosen:
            assert chosen == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with pytest.raises(KeyError), threads_for_load():
            raise KeyError("inside")
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("ATTNLAB_THREADS", "fixed")
        with threads_for_load() as chosen:
            assert chosen == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(start)


def test_the_watch_measures_the_machine_where_it_can():
    first = _machine.cpu_sample()
    if first is None:
        pytest.skip("no /proc/stat here")
    watch = _threads._LoadWatch()
    free = watch.free(_machine.cpu_count())
    assert free is None or 0.0 <= free <= _machine.cpu_count()


def test_competing_load_starts_busy_processes_and_stops_them():
    with _machine.competing_load(1, max_seconds=30) as spinners:
        assert len(spinners) == 1 and spinners[0].poll() is None  # running
        start = time.process_time()
        time.sleep(0.3)
        assert time.process_time() - start < 0.1  # the load is another process, not this one
        line = _machine.machine_line(competing=1)
    assert spinners[0].poll() is not None  # stopped with the block
    assert "1 competing busy process started by --load" in line and "CPU:" in line


def test_a_competing_process_stops_by_itself_at_its_deadline():
    with _machine.competing_load(1, max_seconds=0.5) as spinners:
        spinners[0].wait(timeout=20)
        assert spinners[0].returncode == 0
    with pytest.raises(ValueError, match="give 0 or more"):
        with _machine.competing_load(-1):
            pass


@pytest.mark.parametrize("value", ["fixd", "1"])
def test_a_mistyped_thread_policy_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv("ATTNLAB_THREADS", value)
    with pytest.raises(ValueError, match=f"ATTNLAB_THREADS='{value}' is not one of adaptive, fixed"):
        _threads.adaptive()
    monkeypatch.setenv("ATTNLAB_THREADS", " Fixed ")
    assert _threads.adaptive() is False
