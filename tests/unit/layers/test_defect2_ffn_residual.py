"""Regression tests for the article's defect 2: the residual counted twice.

The article's ``PositionWiseFFN`` returns ``x + ffn(layer_norm(x))`` and its encoder
layer then adds ``x`` again and normalises again. In attnlab the FFN is pure
(``Linear -> GELU -> Dropout -> Linear -> Dropout``) and the layer owns the residual
and the norms. Each test here fails on the article's code.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import PositionWiseFFN, TransformerEncoderLayer


def test_defect2_ffn_is_pure_linear_gelu_linear() -> None:
    ffn = PositionWiseFFN(16, 48, dropout=0.1).eval()
    x = torch.randn(2, 5, 16)
    expected = F.linear(F.gelu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)), ffn.linear2.weight, ffn.linear2.bias)
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-6)


def test_defect2_ffn_has_no_norm_and_no_residual() -> None:
    ffn = PositionWiseFFN(16, 48, dropout=0.0)
    assert not any(isinstance(module, nn.LayerNorm) for module in ffn.modules())
    with torch.no_grad():
        ffn.linear2.weight.zero_()
        ffn.linear2.bias.zero_()
    x = torch.randn(3, 16)
    # A zeroed last projection leaves nothing: no residual inside the FFN.
    assert torch.equal(ffn(x), torch.zeros_like(x))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_defect2_layer_counts_the_residual_once(norm_first: bool) -> None:
    """The layer equals its textbook formula built from its own parts."""
    layer = TransformerEncoderLayer(16, 4, 32, dropout=0.0, norm_first=norm_first).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    x = torch.randn(2, 5, 16)

    def attend(h):
        return layer.self_attn(h, h, h)[0]

    def ffn(h):
        return layer.ffn.linear2(F.gelu(layer.ffn.linear1(h)))

    if norm_first:
        h = x + attend(layer.norm1(x))
        expected = h + ffn(layer.norm2(h))
    else:
        h = layer.norm1(x + attend(x))
        expected = layer.norm2(h + ffn(h))
    torch.testing.assert_close(layer(x)[0], expected, rtol=0, atol=1e-5)


def test_defect2_pre_norm_layer_with_silent_branches_is_identity() -> None:
    """With attention and FFN outputs zeroed, ``x + 0 + 0 == x``; a second residual would give ``2x``."""
    layer = TransformerEncoderLayer(16, 4, 32, dropout=0.0, norm_first=True).eval()
    with torch.no_grad():
        for linear in (layer.self_attn.out_proj, layer.ffn.linear2):
            linear.weight.zero_()
            linear.bias.zero_()
    x = torch.randn(2, 5, 16)
    assert torch.equal(layer(x)[0], x)
