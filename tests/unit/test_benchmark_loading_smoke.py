"""benchmarks/loading.py still runs (a tiny sharded checkpoint; nothing about speed or memory
is asserted) and removes its temporary folder."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "loading.py"


def test_tiny_run_prints_the_table_and_removes_its_checkpoint(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its temporary folder goes
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_loading", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        assert module.main(["--hidden", "64", "--layers", "2", "--heads", "4", "--intermediate", "96",
                            "--vocab", "100", "--shard-gb", "0.00003", "--dtypes", "bfloat16"]) == 0
    finally:
        sys.modules.pop(spec.name, None)
    printed = capsys.readouterr().out
    assert "| bfloat16 (bfloat16) |" in printed and "CPU:" in printed and "shards" in printed
    assert list(tmp_path.iterdir()) == []  # the checkpoint is gone
