"""benchmarks/generate.py still runs (tiny sizes; nothing about speed is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the benchmark compares with transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "generate.py"


@pytest.mark.parametrize("family,dtype", [("llama", "float32"), ("gpt2", "float32"), ("llama", "bfloat16"),
                                          ("qwen3", "float32"), ("qwen3", "bfloat16")])
def test_quick_run_prints_the_table(capsys, family, dtype):
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_generate", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick", "--batches", "2", "--threads", "1", "--family", family,
                            "--dtype", dtype]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "| 2 |" in printed and "recorded weights" in printed and f"random {family} in {dtype}" in printed
    assert "| 2 | prefill |" in printed and f"MiB of {dtype} weights" in printed and "CPU: " in printed
    assert ("attnlab generate, float32" in printed) == (dtype != "float32")
    assert "decoding steps alone" in printed
    assert "native step" in printed  # whether it served, or why not
    if family == "qwen3":  # a transformers model: the native step serves it in every dtype
        assert "native step serves" in printed and "transformers' generate runs" not in printed
