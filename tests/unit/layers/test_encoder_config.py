"""EncoderConfig: validation and round trips."""

from __future__ import annotations

import json

import pytest

from attnlab import EncoderConfig, TransformerEncoder


def test_round_trip_through_dict_and_json() -> None:
    config = EncoderConfig(100, d_model=48, num_layers=3, num_heads=6, d_ff=96, pad_id=1,
                           norm_first=True, position="rotary", type_vocab_size=2, attention_dropout=0.0)
    assert EncoderConfig.from_dict(config.to_dict()) == config
    assert EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_article_defaults() -> None:
    config = EncoderConfig(100)
    assert (config.d_model, config.num_layers, config.num_heads, config.d_ff, config.dropout, config.max_len) == (
        512, 6, 8, 2048, 0.1, 5000
    )
    # Attention-probability dropout is off by default (it costs the fused kernel);
    # attention_dropout=None restores the article's behaviour of reusing `dropout`.
    assert config.effective_attention_dropout == 0.0
    assert EncoderConfig(100, attention_dropout=None).effective_attention_dropout == 0.1
    assert EncoderConfig(100, attention_dropout=0.2).effective_attention_dropout == 0.2


def test_model_keeps_its_config() -> None:
    model = TransformerEncoder(100, d_model=16, num_layers=1, num_heads=2, d_ff=32, pad_id=0, position="learned")
    assert model.config == EncoderConfig(100, 16, 1, 2, 32, pad_id=0, position="learned")


def test_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown EncoderConfig keys \['heads'\]"):
        EncoderConfig.from_dict({"vocab_size": 10, "heads": 2})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"vocab_size": 0}, r"vocab_size must be a positive int, got 0"),
        ({"d_model": 10, "num_heads": 4}, r"d_model=10 is not divisible by num_heads=4"),
        ({"max_len": 0}, r"max_len must be a positive int, got 0"),
        ({"dropout": 1.0}, r"dropout must be a float in \[0, 1\), got 1.0"),
        ({"attention_dropout": -0.5}, r"attention_dropout must be a float in \[0, 1\), got -0.5"),
        ({"pad_id": 10}, r"pad_id=10 must lie in \[0, vocab_size=10\)"),
        ({"pad_id": -1}, r"pad_id=-1 must lie in \[0, vocab_size=10\)"),
        ({"position": "alibi"}, r"position must be one of .* got 'alibi'"),
        ({"position": "rotary", "d_model": 6, "num_heads": 2}, r"position='rotary' needs an even head dim, got .* = 3"),
        ({"activation": "tanh"}, r"activation must be one of .* got 'tanh'"),
        ({"attention": "linear"}, r"attention must be one of .* got 'linear'"),
        ({"type_vocab_size": -1}, r"type_vocab_size must be >= 0, got -1"),
        ({"layer_norm_eps": 0.0}, r"layer_norm_eps must be > 0, got 0.0"),
    ],
)
def test_invalid_values(kwargs, match) -> None:
    values = {"vocab_size": 10, "d_model": 8, "num_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        EncoderConfig(**values)
    with pytest.raises(ValueError, match=match):
        TransformerEncoder(**values)
