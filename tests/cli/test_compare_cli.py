"""`attnlab compare` and the comparison behind it: two models' per-head statistics, differences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.cli import SUBCOMMANDS, main
from attnlab.data import Tokenizer, train_tokenizer
from attnlab.inspect.commands.compare_models import compare_models

TEXTS = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    paths = {}
    for name, seed in (("a", 0), ("b", 1)):
        torch.manual_seed(seed)
        encoder = TransformerEncoder(
            tokenizer.vocab_size, 16, 2, 2, 32, max_len=32, pad_id=tokenizer.pad_token_id
        )
        EncoderClassifier(encoder, 2, label_names=["neg", "pos"]).save_pretrained(
            root / name, tokenizer=tokenizer
        )
        paths[name] = root / name
    (root / "texts.csv").write_text("text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(TEXTS)))
    paths["data"] = root / "texts.csv"
    paths["tokenizer"] = tokenizer
    return paths


def test_compare_is_registered():
    assert SUBCOMMANDS["compare"][0] == "attnlab.cli.compare"


def test_a_model_against_itself_differs_by_nothing(pair):
    import attnlab

    model, tokenizer, _ = attnlab.load(pair["a"])
    rows = [(text, None) for text in TEXTS]
    comparison = compare_models(model, tokenizer, model, tokenizer, rows, batch_size=8, max_length=16)
    for name, values in comparison.result["statistics"].items():
        assert all(v == 0 for row in values["difference"] for v in row if v is not None), name
    assert comparison.result["same_shape"]


def test_differences_are_b_minus_a(pair):
    import attnlab

    (model_a, tokenizer, _), (model_b, _, _) = attnlab.load(pair["a"]), attnlab.load(pair["b"])
    comparison = compare_models(
        model_a, tokenizer, model_b, tokenizer, [(t, None) for t in TEXTS], max_length=16
    )
    entropy = comparison.result["statistics"]["entropy"]
    assert entropy["difference"][1][0] == pytest.approx(entropy["b"][1][0] - entropy["a"][1][0])
    assert entropy["a"] == comparison.a["entropy"] and entropy["b"] == comparison.b["entropy"]
    largest = comparison.result["summary"]["entropy"]["largest_change"]
    assert largest["layer"].startswith("layer_") and largest["head"] in ("head_1", "head_2")
    assert "B − A" in comparison._repr_html_()


def test_compare_writes_json_and_a_page(pair, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert (
        main(
            [
                "compare",
                "--model",
                str(pair["a"]),
                "--model",
                str(pair["b"]),
                "--data",
                str(pair["data"]),
                "--out",
                str(out),
                "--importance",
            ]
        )
        == 0
    )
    data = json.loads((out / "comparison.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert "head_importance" in data["statistics"] and data["texts"] == {"a": len(TEXTS), "b": len(TEXTS)}
    page = (out / "comparison.html").read_text()
    assert page.count('data-statistic="entropy"') >= 1 and "http" not in page
    assert "mean |B - A|" in capsys.readouterr().out


def test_compare_needs_two_models(pair, tmp_path, capsys):
    assert (
        main(
            ["compare", "--model", str(pair["a"]), "--data", str(pair["data"]), "--out", str(tmp_path / "x")]
        )
        == 2
    )
    assert "exactly twice" in capsys.readouterr().err
