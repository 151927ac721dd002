"""Regression tests for the article's defect 3: ``PositionalEncoding``.

The article's table assignment ``pe[:, 1::2] = cos(position * div_term)`` fails for
odd ``d_model`` (one column too many), and an input longer than ``max_len`` fails
with an opaque broadcasting error. attnlab handles odd widths and raises a
``ValueError`` that names ``max_len``. Each test here fails on the article's code.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import PositionalEncoding, TransformerEncoder


def _formula(max_len: int, d_model: int) -> torch.Tensor:
    """Vaswani et al., element by element in float64, independent of the library."""
    table = torch.empty(max_len, d_model, dtype=torch.float64)
    for i in range(d_model):
        frequency = 1.0 / (10000.0 ** ((i - i % 2) / d_model))
        for pos in range(max_len):
            angle = pos * frequency
            table[pos, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return table


@pytest.mark.parametrize("d_model", [1, 7, 15, 16])
def test_defect3_odd_d_model_matches_formula(d_model: int) -> None:
    max_len = 40
    module = PositionalEncoding(d_model, max_len=max_len)
    x = torch.zeros(2, max_len, d_model)
    out = module(x)
    assert out.shape == (2, max_len, d_model)
    expected = _formula(max_len, d_model)
    torch.testing.assert_close(out[0].double(), expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(out[1], out[0])


def test_defect3_odd_d_model_in_the_encoder() -> None:
    model = TransformerEncoder(50, d_model=9, num_layers=1, num_heads=3, d_ff=18, max_len=16).eval()
    x, _ = model(torch.randint(0, 50, (2, 16)))
    assert x.shape == (2, 16, 9)
    assert torch.isfinite(x).all()


def test_defect3_past_max_len_raises_clear_value_error() -> None:
    module = PositionalEncoding(8, max_len=10)
    module(torch.zeros(1, 10, 8))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"sequence length 11 exceeds max_len=10"):
        module(torch.zeros(1, 11, 8))


def test_defect3_encoder_past_max_len_raises_clear_value_error() -> None:
    model = TransformerEncoder(20, d_model=8, num_layers=1, num_heads=2, d_ff=16, max_len=6)
    with pytest.raises(ValueError, match=r"input length 7 exceeds max_len=6"):
        model(torch.zeros(1, 7, dtype=torch.long))
