"""benchmarks/generate.py still runs (tiny sizes; nothing about speed is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the benchmark compares with transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "generate.py"


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen3"])
def test_quick_run_prints_the_table(capsys, family):
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_generate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick", "--batches", "2", "--threads", "1", "--family", family]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "| 2 |" in printed and "recorded weights" in printed and f"random {family}" in printed
    assert "native step" in printed  # whether it served, or why not
