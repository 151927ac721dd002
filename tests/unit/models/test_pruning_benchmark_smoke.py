"""The pruning benchmark: which heads it removes, and one tiny end-to-end run (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "pruning.py"


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("pruning_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lowest_heads_go_first_and_every_layer_keeps_one(benchmark):
    scores = np.array([[0.1, 0.2, 0.9], [0.05, 0.06, 0.07]])
    assert benchmark.choose_heads(scores, 2) == {"layer_2": [0, 1]}
    assert benchmark.choose_heads(scores, 3) == {"layer_2": [0, 1], "layer_1": [0]}
    assert benchmark.choose_heads(scores, 6) == {"layer_2": [0, 1], "layer_1": [0, 1]}  # at most 4 can go


def test_a_tiny_run(benchmark, tmp_path, capsys):
    tokenizer = Tokenizer(train_tokenizer(["a fine film", "dull and long", "great fun"] * 5, vocab_size=60))
    torch.manual_seed(0)
    encoder = TransformerEncoder(
        tokenizer.vocab_size, 16, 2, 4, 32, max_len=64, pad_id=tokenizer.pad_token_id
    )
    EncoderClassifier(encoder, 2).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    assert (
        benchmark.main(
            [
                "--model",
                str(tmp_path / "model"),
                "--texts",
                "20",
                "--repeats",
                "1",
                "--max-length",
                "16",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "out" / "pruning.json").read_text())
    assert [point["heads_removed"] for point in result["curves"]["importance"]] == [0, 1, 2, 2, 3, 4, 5, 6, 6]
    assert result["curves"]["random"][0]["accuracy"] == result["full_accuracy"]
    assert (tmp_path / "out" / "pruning.png").read_bytes()[:4] == b"\x89PNG"
