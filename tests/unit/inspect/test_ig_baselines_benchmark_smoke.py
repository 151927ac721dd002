"""The integrated-gradients baseline benchmark: its deletions by hand, and the --quick run
(tiny random models; nothing about speed or faithfulness is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "ig_baselines.py"


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("ig_baselines_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)  # puts benchmarks/ on the path for faithfulness.py
        yield module
    finally:
        sys.path[:] = path
        sys.modules.pop("faithfulness", None)


def test_deletions_by_hand(benchmark):
    ids = [2, 10, 11, 12, 13, 3]  # [CLS] a b c d [SEP]
    variants = benchmark._deletion_inputs(ids, [1, 2, 3, 4], [3, 1, 2, 4])
    # k = 10 .. 100 %: without the top ceil(k * 4 / 100) tokens
    assert variants[0] == [2, 10, 11, 13, 3] and variants[4] == [2, 11, 13, 3]
    assert len(variants) == 10 and variants[-1] == [2, 3]


def test_stops_at_the_first_points_under_five_percent(benchmark):
    gaps = {50: 0.3, 100: 0.04, 200: 0.0}
    tried = []

    def run(points):
        tried.append(points)
        return [points], gaps[points]

    scores, points, first_gap, last_gap = benchmark._until_complete(run, (50, 100, 200))
    assert tried == [50, 100] and points == 100 and (first_gap, last_gap) == (0.3, 0.04)


def test_the_quick_run_prints_the_cpu_and_a_table_per_model(benchmark, capsys):
    assert benchmark.main(["--quick", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("cpu: ")
    assert "tiny classifier (classifier)" in printed and "tiny decoder (decoder)" in printed
    for row in ("| pad |", "| zero |", "| mean |", "| random ranking |"):
        assert printed.count(row) == 2
