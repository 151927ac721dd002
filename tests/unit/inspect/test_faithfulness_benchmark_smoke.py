"""The faithfulness benchmark: its erasures by hand, and one tiny end-to-end run (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "faithfulness.py"
TEXTS = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 4


@pytest.fixture(scope="module")
def benchmark():
    spec = importlib.util.spec_from_file_location("faithfulness_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_erasures_by_hand(benchmark):
    ids = [2, 10, 11, 12, 13, 3]  # [CLS] a b c d [SEP]
    variants = benchmark._variants(ids, [1, 2, 3, 4], [3, 1, 2, 4])
    # comprehensiveness: without the top ceil(k * 4 / 100) = 1, 1, 2 tokens
    assert variants[:3] == [[2, 10, 11, 13, 3], [2, 10, 11, 13, 3], [2, 11, 13, 3]]
    # sufficiency: only those tokens (and the special ones)
    assert variants[3:6] == [[2, 12, 3], [2, 12, 3], [2, 10, 12, 3]]
    # deletion at 10 ... 100 %: ends with the special tokens alone
    assert len(variants[6:]) == 10 and variants[-1] == [2, 3]


def test_a_tiny_run_writes_the_table(benchmark, tmp_path, capsys):
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(
        tokenizer.vocab_size, 16, 2, 2, 32, max_len=64, pad_id=tokenizer.pad_token_id
    )
    EncoderClassifier(encoder, 2).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    assert (
        benchmark.main(
            [
                "--model",
                str(tmp_path / "model"),
                "--texts",
                "3",
                "--steps",
                "2",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "out" / "faithfulness.json").read_text())
    methods = result["models"][str(tmp_path / "model")]["methods"]
    assert set(methods) == {
        "raw",
        "rollout",
        "flow",
        "grad-attention",
        "relevance",
        "integrated-gradients",
        "attn-lrp",
        "random",
    }
    assert all(
        len(values["deletion_curve"]) == 11 and values["deletion_curve"][0] == 0
        for values in methods.values()
    )
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"
    assert "| random |" in capsys.readouterr().out


def test_a_tiny_decoder_run_puts_every_method_and_random_side_by_side(benchmark, tmp_path, capsys):
    transformers = pytest.importorskip("transformers", reason="the tiny decoder is written with transformers")
    from tokenizers import Tokenizer as RawTokenizer, models, pre_tokenizers

    words = sorted({word for text in TEXTS for word in text.split()} | {"<unk>", "<s>", "</s>"})
    raw = RawTokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    directory = tmp_path / "lm"
    directory.mkdir()
    raw.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    assert benchmark.main(["--decoder", str(directory), "--texts", "3", "--steps", "2", "--prompt-tokens", "6",
                           "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "faithfulness.json").read_text())["models"][str(directory)]
    assert set(result["methods"]) == {"raw", "rollout", "grad-attention", "integrated-gradients", "occlusion",
                                      "attn-lrp", "random"}
    assert result["measure"] == "log p(next token), nats"
    assert all(values["deletion_curve"][0] == 0 for values in result["methods"].values())
    assert "| occlusion |" in capsys.readouterr().out
