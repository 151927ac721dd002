"""The transformers-backend benchmark still runs (a tiny model; nothing about speed is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_backend.py"


def test_quick_run_prints_every_figure(capsys):
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_hf_backend", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick"]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    for text in ("CPU:", "every layer's weights", "one layer's weights", "statistics mode", "eager + output_attentions"):
        assert text in printed
