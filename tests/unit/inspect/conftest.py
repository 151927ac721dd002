"""Shared small models and tokenizers for the inspection tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from attnlab import TransformerEncoder

WORDS = "the a movie film was is great bad fun boring and but not very plot acting".split()


def tiny_tokenizer() -> Tokenizer:
    """Word-level tokenizer: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, punctuation, a few words."""
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", ",", ".", "!", "<", ">", "script", "/"] + WORDS
    tokenizer = Tokenizer(
        models.WordLevel({token: i for i, token in enumerate(vocabulary)}, unk_token="[UNK]")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tokenizer


def tiny_encoder(seed: int = 0, **options) -> TransformerEncoder:
    torch.manual_seed(seed)
    settings = dict(d_model=16, num_layers=2, num_heads=4, d_ff=32, dropout=0.1, max_len=64, pad_id=0)
    settings.update(options)
    return TransformerEncoder(len(tiny_tokenizer().get_vocab()), **settings).eval()


def save_tiny_run(directory: Path, seed: int = 0) -> Path:
    """A run directory in the agreed layout, holding a bare encoder checkpoint."""
    model = tiny_encoder(seed)
    checkpoint = directory / "checkpoints" / "best"
    checkpoint.mkdir(parents=True)
    save_file(
        {f"encoder.{k}": v.contiguous() for k, v in model.state_dict().items()},
        str(checkpoint / "model.safetensors"),
    )
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "encoder", "encoder": model.config.to_dict(), "head": {}})
    )
    (directory / "config.json").write_text(json.dumps({"model": model.config.to_dict()}))
    tiny_tokenizer().save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def tokenizer() -> Tokenizer:
    return tiny_tokenizer()


@pytest.fixture
def encoder() -> TransformerEncoder:
    return tiny_encoder()


@pytest.fixture
def tiny_run(tmp_path: Path) -> Path:
    return save_tiny_run(tmp_path / "run")


@pytest.fixture(scope="module")
def browser(chromium):
    """The same headless chromium, under the name the page tests use."""
    return chromium


def open_offline(browser, path: Path):
    """Open ``path``; returns ``(page, problems, requests)`` (console errors, every URL asked for)."""
    page = browser.new_page()
    problems, requests = [], []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    return page, problems, requests


@pytest.fixture
def open_page():
    """:func:`open_offline`, for tests (test modules do not import conftest by name)."""
    return open_offline
