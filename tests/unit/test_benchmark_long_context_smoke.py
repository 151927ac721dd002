"""benchmarks/long_context.py still runs (a small model; nothing about speed or memory is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the model is a transformers Llama")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_context.py"


def test_quick_run_prints_each_mode_for_each_length(capsys):
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_long_context", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick", "--modes", "sdpa", "rows", "statistics"]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "CPU:" in printed
    row = next(line for line in printed.splitlines() if line.strip().startswith("256 "))
    assert row.count(" s ") == 3 and "failed" not in row
