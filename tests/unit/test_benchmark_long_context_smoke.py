"""benchmarks/long_context.py still runs (a small model; nothing about speed or memory is asserted)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the model is a transformers Llama")


def test_quick_run_prints_each_mode_for_each_length(capsys, run_benchmark):
    assert run_benchmark("long_context", ["--quick", "--modes", "sdpa", "rows", "statistics"]) == 0
    printed = capsys.readouterr().out
    assert "CPU:" in printed
    row = next(line for line in printed.splitlines() if line.strip().startswith("256 "))
    assert row.count(" s ") == 3 and "failed" not in row
