"""`attnlab explain --method attn-lrp` end to end: a generation (attnlab's decoder and a model opened
through transformers) and a text through a classifier; JSON with the explained logit and the
relevances' sum, PNG and page."""

from __future__ import annotations

import json
import re

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from attnlab.cli import main

from test_explain_generation_cli import _save  # tests/cli/test_explain_generation_cli.py

transformers = pytest.importorskip("transformers", reason="the tiny models are written with transformers")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_explain_a_generation_with_attn_lrp(kind, tmp_path):
    (tmp_path / kind).mkdir()
    directory = _save(tmp_path / kind, kind)
    out = tmp_path / "out"
    code = main(["explain", "--model", str(directory), "--prompt", "the cat sat on", "--continuation",
                 " the mat", "--method", "attn-lrp", "raw", "--out", str(out)])
    assert code == 0
    (prompt,) = json.loads((out / "explanation.json").read_text())["prompts"]
    assert prompt["methods"] == ["attn-lrp", "raw"]
    G = len(prompt["generated"])
    assert [len(row) for row in prompt["scores"]["attn-lrp"]] == [4 + g for g in range(G)]
    assert len(prompt["attn_lrp_logit"]) == len(prompt["attn_lrp_sum"]) == G
    for row, total in zip(prompt["scores"]["attn-lrp"], prompt["attn_lrp_sum"]):
        assert sum(row) == pytest.approx(total, abs=1e-5)
    assert (out / "explanation.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "explanation.html").read_text()
    assert "attn-lrp" in page and not re.search(r"(src|href)=\"http", page)


def test_explain_a_text_with_attn_lrp(tmp_path):
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "superb", "dull", "film", "plot"]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocabulary), hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=16,
                                     num_labels=2, pad_token_id=0, id2label={0: "neg", 1: "pos"},
                                     label2id={"neg": 0, "pos": 1})
    directory = tmp_path / "bert"
    transformers.BertForSequenceClassification(config).eval().save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    out = tmp_path / "out"
    code = main(["explain", "--model", str(directory), "--text", "a superb film", "--method", "attn-lrp",
                 "--target", "pos", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "explanation.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["methods"] == ["attn-lrp"] and data["target_name"] == "pos"
    assert len(data["scores"]["attn-lrp"]) == len(data["tokens"]) == 5
    assert sum(data["scores"]["attn-lrp"]) == pytest.approx(data["attn_lrp_sum"], abs=1e-5)
    assert isinstance(data["attn_lrp_logit"], float)
    assert (out / "explanation.png").read_bytes()[:4] == b"\x89PNG"
    assert "attn-lrp" in (out / "explanation.html").read_text()
