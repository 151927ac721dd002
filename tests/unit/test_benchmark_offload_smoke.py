"""benchmarks/offload.py still runs (a tiny model; nothing about speed or memory is asserted), its
offloaded run gives the whole model's statistics, and it removes its temporary folder."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the checkpoint is written by transformers")
pytest.importorskip("accelerate", reason="device maps need the big extra")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "offload.py"


def test_quick_run_prints_the_table_and_removes_its_checkpoint(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its temporary folder goes
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_offload", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--quick", "--budgets", "0.25"]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "CPU:" in printed and "| whole (" in printed
    offloaded = next(line for line in printed.splitlines() if line.startswith("| 0.25 of the weights"))
    assert "on disk" in offloaded
    assert float(offloaded.strip(" |").split("|")[-1]) < 1e-5  # the whole model's statistics
    assert list(tmp_path.iterdir()) == []  # the checkpoint and the offload folder are gone
