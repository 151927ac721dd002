"""TransformerEncoderLayer: weights, head mask, custom attention, options."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention, TransformerEncoderLayer

E, HEADS, FF = 16, 4, 32


def test_weights_only_when_asked_and_paths_agree() -> None:
    layer = TransformerEncoderLayer(E, HEADS, FF).eval()
    x = torch.randn(2, 5, E)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)[:, None, None, :]
    fused, none = layer(x, mask)
    out, weights = layer(x, mask, need_weights=True)
    assert none is None and weights.shape == (2, HEADS, 5, 5)
    torch.testing.assert_close(out, fused, rtol=0, atol=1e-5)


def test_head_mask_reaches_the_attention() -> None:
    layer = TransformerEncoderLayer(E, HEADS, FF).eval()
    x = torch.randn(2, 5, E)
    _, weights = layer(x, need_weights=True, head_mask=torch.tensor([0.0, 1.0, 1.0, 1.0]))
    assert torch.equal(weights[:, 0], torch.zeros(2, 5, 5))


def test_custom_self_attention_module_is_used() -> None:
    attention = MultiHeadAttention(E, HEADS, dropout=0.0, rotary=True)
    layer = TransformerEncoderLayer(E, HEADS, FF, self_attention=attention)
    assert layer.self_attn is attention


@pytest.mark.parametrize("norm_first", [False, True])
def test_dropout_active_in_training_only(norm_first: bool) -> None:
    layer = TransformerEncoderLayer(E, HEADS, FF, dropout=0.3, norm_first=norm_first)
    x = torch.randn(2, 5, E)
    layer.train()
    assert not torch.allclose(layer(x)[0], layer(x)[0])
    layer.eval()
    assert torch.equal(layer(x)[0], layer(x)[0])


def test_attention_dropout_separate_from_residual_dropout() -> None:
    layer = TransformerEncoderLayer(E, HEADS, FF, dropout=0.2, attention_dropout=0.0)
    assert layer.self_attn.dropout == 0.0
    assert layer.dropout1.p == 0.2 and layer.ffn.dropout1.p == 0.2


def test_options_are_passed_through() -> None:
    layer = TransformerEncoderLayer(E, HEADS, FF, activation="relu", layer_norm_eps=1e-6, bias=False,
                                    dtype=torch.float64)
    assert layer.norm1.eps == 1e-6 and layer.ffn.linear1.bias is None
    assert layer.self_attn.in_proj_bias is None
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    assert isinstance(layer.norm2, nn.LayerNorm)
    out, _ = layer(torch.randn(1, 3, E, dtype=torch.float64))
    assert out.dtype == torch.float64
