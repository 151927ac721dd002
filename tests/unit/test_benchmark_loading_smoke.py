"""benchmarks/loading.py still runs (a tiny sharded checkpoint; nothing about speed or memory
is asserted) and removes its temporary folder."""

from __future__ import annotations

import tempfile


def test_tiny_run_prints_the_table_and_removes_its_checkpoint(capsys, monkeypatch, tmp_path, run_benchmark):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its temporary folder goes
    assert run_benchmark("loading", ["--hidden", "64", "--layers", "2", "--heads", "4", "--intermediate", "96",
                                     "--vocab", "100", "--shard-gb", "0.00003", "--dtypes", "bfloat16"]) == 0
    printed = capsys.readouterr().out
    assert "| bfloat16 (bfloat16) |" in printed and "CPU:" in printed and "shards" in printed
    assert list(tmp_path.iterdir()) == []  # the checkpoint is gone
