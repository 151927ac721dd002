"""benchmarks/serve.py still runs (a tiny decoder, seconds; nothing about speed is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the explorer needs the serve extra: pip install 'attnlab[serve]'")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


def test_quick_run_prints_both_tables(capsys) -> None:
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_serve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick", "--seconds", "1", "--clients", "4"]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "| tiny (decoder) |" in printed and "| tiny | 4 x 1 s |" in printed and printed.startswith("CPU:")
