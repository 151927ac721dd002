"""benchmarks/offload.py still runs (a tiny model; nothing about speed or memory is asserted), its
offloaded run gives the whole model's statistics, and it removes its temporary folder."""

from __future__ import annotations

import tempfile

import pytest

pytest.importorskip("transformers", reason="the checkpoint is written by transformers")
pytest.importorskip("accelerate", reason="device maps need the big extra")


def test_quick_run_prints_the_table_and_removes_its_checkpoint(capsys, monkeypatch, tmp_path, run_benchmark):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where its temporary folder goes
    assert run_benchmark("offload", ["--quick", "--budgets", "0.25"]) == 0
    printed = capsys.readouterr().out
    assert "CPU:" in printed and "| whole (" in printed
    offloaded = next(line for line in printed.splitlines() if line.startswith("| 0.25 of the weights"))
    assert "on disk" in offloaded
    assert float(offloaded.strip(" |").split("|")[-1]) < 1e-5  # the whole model's statistics
    assert list(tmp_path.iterdir()) == []  # the checkpoint and the offload folder are gone
