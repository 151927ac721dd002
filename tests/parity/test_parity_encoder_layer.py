"""``attnlab.TransformerEncoderLayer`` against ``torch.nn.TransformerEncoderLayer``.

Weights are copied explicitly (``self_attn`` has nn's parameter names, our
``ffn.linear1/linear2`` are nn's ``linear1/linear2``, ``norm1/norm2`` match), both
layers run in eval mode in float32 with exact GELU, and outputs must agree to 1e-5,
for post-norm and pre-norm, with and without padding. nn's padding mask is ``True``
on padding; ours is ``True`` on real tokens.

nn's layer takes a native "fast path" in inference mode (no autograd), which returns
zeros at padded positions; the comparison runs with autograd on, where nn runs its
ordinary computation at every position.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import TransformerEncoderLayer
from attnlab.attention import causal_mask

ATOL = 1e-5
E, HEADS, FF = 32, 4, 64


def _pair(norm_first: bool):
    ours = TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, norm_first=norm_first).eval()
    theirs = nn.TransformerEncoderLayer(
        E, HEADS, FF, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():
        for parameter in ours.parameters():  # non-trivial values everywhere, biases and norms included
            parameter.copy_(torch.randn_like(parameter) * 0.2)
        ours.norm1.weight.add_(1.0)
        ours.norm2.weight.add_(1.0)
        copies = {
            "self_attn.in_proj_weight": ours.self_attn.in_proj_weight,
            "self_attn.in_proj_bias": ours.self_attn.in_proj_bias,
            "self_attn.out_proj.weight": ours.self_attn.out_proj.weight,
            "self_attn.out_proj.bias": ours.self_attn.out_proj.bias,
            "linear1.weight": ours.ffn.linear1.weight,
            "linear1.bias": ours.ffn.linear1.bias,
            "linear2.weight": ours.ffn.linear2.weight,
            "linear2.bias": ours.ffn.linear2.bias,
            "norm1.weight": ours.norm1.weight,
            "norm1.bias": ours.norm1.bias,
            "norm2.weight": ours.norm2.weight,
            "norm2.bias": ours.norm2.bias,
        }
        their_params = dict(theirs.named_parameters())
        assert set(their_params) == set(copies)
        for name, value in copies.items():
            their_params[name].copy_(value)
    return ours, theirs


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_no_mask(norm_first: bool, need_weights: bool) -> None:
    ours, theirs = _pair(norm_first)
    x = torch.randn(3, 7, E)
    out, weights = ours(x, need_weights=need_weights)
    assert (weights is not None) == need_weights
    torch.testing.assert_close(out, theirs(x), rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_padding(norm_first: bool, need_weights: bool) -> None:
    ours, theirs = _pair(norm_first)
    x = torch.randn(3, 6, E)
    real = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    out, _ = ours(x, real[:, None, None, :], need_weights=need_weights)  # [B, 1, 1, T]
    expected = theirs(x, src_key_padding_mask=~real)
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_causal_mask(norm_first: bool) -> None:
    ours, theirs = _pair(norm_first)
    x = torch.randn(2, 6, E)
    out, _ = ours(x, causal_mask(6))
    expected = theirs(x, src_mask=~causal_mask(6))
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_gradients_match(norm_first: bool) -> None:
    ours, theirs = _pair(norm_first)
    x = torch.randn(2, 5, E)
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    cotangent = torch.randn(2, 5, E)
    (ours(x, real[:, None, None, :])[0] * cotangent).sum().backward()
    (theirs(x, src_key_padding_mask=~real) * cotangent).sum().backward()
    theirs_by_name = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        their_name = name.replace("ffn.", "")
        expected = theirs_by_name[their_name].grad
        atol = ATOL * max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(parameter.grad, expected, rtol=0, atol=atol, msg=lambda text: f"{name}: {text}")


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
def test_torch_keywords_are_read_as_torch_reads_them(norm_first: bool) -> None:
    """``src_mask`` / ``src_key_padding_mask`` mean to ours what they mean to torch.nn."""
    ours, theirs = _pair(norm_first)
    x = torch.randn(3, 6, E)
    padding = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    forbidden = ~causal_mask(6)
    expected = theirs(x, src_mask=forbidden, src_key_padding_mask=padding)
    got, _ = ours(x, src_mask=forbidden, src_key_padding_mask=padding)
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)
    additive = torch.zeros(6, 6).masked_fill(forbidden, float("-inf"))
    got, _ = ours(x, src_mask=additive, attention_mask=(~padding).float())
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)
