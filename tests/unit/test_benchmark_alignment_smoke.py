"""benchmarks/alignment.py still runs (a few steps; nothing about how fast AER falls is asserted),
and its gold links are the reversal the task defines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the benchmark builds a tiny BART with transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "alignment.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("attnlab_benchmark_alignment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_a_few_steps_print_the_aer_table(bench, capsys):
    assert bench.main(["--steps", "4", "--every", "2", "--held-out", "6", "--batch-size", "4"]) == 0
    printed = capsys.readouterr().out
    assert "| step | training loss | AER (predicting rows) |" in printed
    rows = [line for line in printed.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["0", "2", "4"]
    for row in rows:
        assert 0.0 <= float(row.split("|")[3]) <= 1.0


def test_the_task_reverses_digits_into_words_and_the_gold_links_say_so(bench):
    digits = [3, 1, 4]
    assert bench.target_ids(digits)[:-1] == [bench.WORD0 + 4, bench.WORD0 + 1, bench.WORD0 + 3]
    assert bench.gold_links(digits).sure == {(0, 2), (1, 1), (2, 0)}
    batch = bench.collate([digits, [7]])
    assert batch["labels"][1].tolist() == [bench.WORD0 + 7, bench.EOS, -100, -100]
    assert batch["attention_mask"][1].tolist() == [1, 1, 0, 0]
