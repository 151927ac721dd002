"""PositionWiseFFN: activations, dropout placement, arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import PositionWiseFFN


@pytest.mark.parametrize(
    ("name", "function"),
    [
        ("gelu", F.gelu),
        ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
        ("relu", F.relu),
        ("silu", F.silu),
        (torch.tanh, torch.tanh),
    ],
)
def test_activations(name, function) -> None:
    ffn = PositionWiseFFN(8, 16, dropout=0.0, activation=name)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ffn(x), ffn.linear2(function(ffn.linear1(x))))


def test_dropout_in_training_only() -> None:
    ffn = PositionWiseFFN(8, 16, dropout=0.5)
    x = torch.randn(4, 8)
    ffn.train()
    assert not torch.equal(ffn(x), ffn(x))
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))


def test_shapes_bias_dtype() -> None:
    ffn = PositionWiseFFN(8, 16, bias=False, dtype=torch.float64)
    assert ffn.linear1.bias is None and ffn.linear2.bias is None
    assert ffn(torch.randn(2, 3, 4, 8, dtype=torch.float64)).shape == (2, 3, 4, 8)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_model": 0, "d_ff": 4}, r"d_model must be a positive int, got 0"),
        ({"d_model": 4, "d_ff": -1}, r"d_ff must be a positive int, got -1"),
        ({"d_model": 4, "d_ff": 4, "dropout": 2.0}, r"dropout must be a float in \[0, 1\), got 2.0"),
        ({"d_model": 4, "d_ff": 4, "activation": "swish"}, r"activation must be one of .* got 'swish'"),
    ],
)
def test_bad_arguments(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        PositionWiseFFN(**kwargs)
