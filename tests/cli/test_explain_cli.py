"""`attnlab explain` on a trained run: per-token scores of all six methods, JSON, PNG, page."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from attnlab.cli import SUBCOMMANDS, main

CONFIG = """
[model]
d_model = 16
num_layers = 2
num_heads = 2
d_ff = 32

[data]
vocab_size = 60
min_frequency = 1
max_length = 16

[train]
epochs = 2
batch_size = 8
warmup_steps = 2
learning_rate = 3e-3
eval_batch_size = 32
num_threads = 1
"""


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("explain")
    rng = random.Random(0)
    good, bad = ["great", "fine", "lovely", "superb"], ["awful", "dull", "boring", "poor"]
    rows = ["text,label"]
    for index in range(64):
        label = index % 2
        words = rng.sample(good if label else bad, 2) + rng.sample(["film", "plot", "cast", "story"], 2)
        rng.shuffle(words)
        rows.append(f"{' '.join(words)},{'pos' if label else 'neg'}")
    (root / "reviews.csv").write_text("\n".join(rows) + "\n")
    (root / "run.toml").write_text(CONFIG)
    out = root / "run"
    assert (
        main(
            [
                "train",
                "--config",
                str(root / "run.toml"),
                "--data",
                str(root / "reviews.csv"),
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    return out


def test_explain_is_registered():
    assert SUBCOMMANDS["explain"][0] == "attnlab.cli.explain"


def test_explain_writes_six_methods_for_a_trained_run(trained_run, tmp_path, capsys):
    out = tmp_path / "explained"
    assert (
        main(
            [
                "explain",
                "--model",
                str(trained_run),
                "--text",
                "a superb <script> film",
                "--method",
                "all",
                "--out",
                str(out),
                "--steps",
                "8",
            ]
        )
        == 0
    )
    data = json.loads((out / "explanation.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    methods = ["raw", "rollout", "flow", "grad-attention", "relevance", "integrated-gradients", "attn-lrp"]
    assert data["methods"] == methods  # --method all
    assert all(len(data["scores"][m]) == len(data["tokens"]) for m in methods)
    assert data["target_name"] in ("neg", "pos")
    assert (out / "explanation.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "explanation.html").read_text()
    assert "<script>window" not in page and not re.search(r"(src|href)=\"http", page)
    assert "wrote" in capsys.readouterr().out


def test_explain_a_chosen_class_and_methods(trained_run, tmp_path):
    out = tmp_path / "neg"
    assert (
        main(
            [
                "explain",
                "--model",
                str(trained_run),
                "--text",
                "dull plot",
                "--out",
                str(out),
                "--method",
                "raw",
                "flow",
                "--target",
                "neg",
            ]
        )
        == 0
    )
    data = json.loads((out / "explanation.json").read_text())
    assert data["methods"] == ["raw", "flow"] and data["target_name"] == "neg" and data["target"] == 0


def test_explain_refuses_an_unknown_class(trained_run, tmp_path, capsys):
    code = main(
        [
            "explain",
            "--model",
            str(trained_run),
            "--text",
            "dull",
            "--out",
            str(tmp_path / "x"),
            "--target",
            "happy",
        ]
    )
    assert code == 2 and "happy" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_bare_encoder_gets_the_attention_methods(tmp_path, capsys):
    import torch

    from attnlab import TransformerEncoder
    from attnlab.data import Tokenizer, train_tokenizer

    tokenizer = Tokenizer(train_tokenizer(["a fine film", "dull and long"] * 5, vocab_size=40))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 16, 2, 2, 32, max_len=32, pad_id=tokenizer.pad_token_id)
    encoder.save_pretrained(tmp_path / "encoder", tokenizer=tokenizer)
    out = tmp_path / "explained"
    assert main(["explain", "--model", str(tmp_path / "encoder"), "--text", "a fine film", "--out", str(out)]) == 0
    data = json.loads((out / "explanation.json").read_text())
    assert data["methods"] == ["raw", "rollout", "flow"] and data["target"] is None
    assert "no classifier" in capsys.readouterr().out


def test_without_method_a_classifier_gets_the_most_faithful_measured_one(trained_run, tmp_path, capsys,
                                                                         measured_faithfulness, chromium):
    measured_faithfulness("classifier", "bert", {"grad-attention": 4.0, "raw": 0.2, "rollout": 2.0})
    out = tmp_path / "default"
    assert main(["explain", "--model", str(trained_run), "--text", "a superb film", "--out", str(out)]) == 0
    assert "method: grad-attention, ranked most faithful" in capsys.readouterr().out
    data = json.loads((out / "explanation.json").read_text())
    assert data["methods"] == ["grad-attention"]
    assert data["faithfulness"]["methods"]["grad-attention"]["at_or_below_random"] is False

    out = tmp_path / "raw"
    assert main(["explain", "--model", str(trained_run), "--text", "a superb film", "--method", "raw",
                 "--out", str(out)]) == 0
    assert json.loads((out / "explanation.json").read_text())["faithfulness"]["methods"]["raw"]["at_or_below_random"]
    page = chromium.new_page()
    page.goto((out / "explanation.html").resolve().as_uri())
    assert "measured at or below random" in page.locator(".faithfulness.below-random").inner_text()
    page.close()
