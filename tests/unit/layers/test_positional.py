"""Sinusoidal and learned positions."""

from __future__ import annotations

import pytest
import torch

from attnlab import LearnedPositionalEmbedding, PositionalEncoding
from attnlab.layers import sinusoidal_table


def test_sinusoidal_table_is_a_fixed_buffer_not_in_state_dict() -> None:
    module = PositionalEncoding(8, max_len=12)
    assert list(module.parameters()) == []
    assert "pe" not in module.state_dict()
    torch.testing.assert_close(module.pe[0], sinusoidal_table(12, 8))


def test_sinusoidal_adds_positions_in_input_dtype() -> None:
    module = PositionalEncoding(8, max_len=12)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out = module(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out - x, sinusoidal_table(12, 8)[:5].double().expand(2, 5, 8))


def test_sinusoidal_wrong_width() -> None:
    with pytest.raises(ValueError, match=r"x must be \[B, T, 8\], got shape \(2, 5, 6\)"):
        PositionalEncoding(8, max_len=12)(torch.zeros(2, 5, 6))


def test_learned_positions_add_rows_of_the_table() -> None:
    module = LearnedPositionalEmbedding(6, max_len=10)
    x = torch.randn(2, 4, 6)
    torch.testing.assert_close(module(x), x + module.embedding.weight[:4])
    ids = torch.tensor([[3, 2, 1, 0], [9, 9, 9, 9]])
    torch.testing.assert_close(module(x, ids), x + module.embedding.weight[ids])
    out = module(x)
    out.sum().backward()
    assert module.embedding.weight.grad[:4].abs().sum() > 0
    assert module.embedding.weight.grad[4:].abs().sum() == 0


def test_learned_positions_past_max_len() -> None:
    module = LearnedPositionalEmbedding(6, max_len=4)
    with pytest.raises(ValueError, match=r"sequence length 5 exceeds max_len=4"):
        module(torch.zeros(1, 5, 6))
    with pytest.raises(ValueError, match=r"position_ids reach 4, but max_len=4"):
        module(torch.zeros(1, 2, 6), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"x must be \[B, T, 6\], got shape \(1, 2, 5\)"):
        module(torch.zeros(1, 2, 5))
