"""The sparse-attention benchmark runs end to end on tiny sizes (no speed assertions)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "sparse.py"


@pytest.mark.slow
def test_benchmark_runs_on_tiny_sizes(capsys) -> None:
    spec = importlib.util.spec_from_file_location("sparse_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main([
        "--in-process", "--lengths", "32", "64", "--heads", "2", "--head-dim", "8", "--block", "16",
        "--repeats", "1", "--no-flex", "--train-length", "48", "--train-d-model", "64", "--train-layers", "1",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    for expected in ("sparse", "dense+mask", "--no-flex", "per 1k tokens", "training step", "CPU:",
                     "block-sparse kernel path"):
        assert expected in printed


@pytest.mark.slow
def test_benchmark_times_kernel_paths_side_by_side_under_load(capsys) -> None:
    spec = importlib.util.spec_from_file_location("sparse_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code = module.main([
        "--in-process", "--lengths", "64", "--methods", "sparse", "--heads", "2", "--head-dim", "8",
        "--block", "16", "--repeats", "1", "--no-flex", "--train-length", "0", "--kernels", "torch", "portable",
        "--load", "1",
    ])
    printed = capsys.readouterr().out
    assert code == 0
    for expected in ("1 competing busy process started by --load", "side by side: torch, portable",
                     "sparse[torch] ", "sparse[portable] "):
        assert expected in printed, expected
