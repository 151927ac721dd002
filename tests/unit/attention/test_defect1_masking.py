"""Regression tests for the article's defect 1: masking by ``masked_fill(mask == 0, -1e9)``.

The article's kernel gives a query with no admissible key a *uniform* average over the
masked keys (softmax of equal -1e9 scores), and its -1e9 does not fit in float16. In
attnlab a fully masked row has zero output and zero weights, and masking works
without overflow or NaN in float16 and bfloat16. Each test here fails on the
article's code.
"""

from __future__ import annotations

import pytest
import torch

from attnlab import MultiHeadAttention, ScaledDotProductAttention
from attnlab.attention import attention


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_defect1_fully_masked_row_gives_zero_output_not_uniform_average(need_weights: bool) -> None:
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False  # query 1 may attend to nothing
    out, weights = attention(q, k, v, mask, need_weights=need_weights)
    # The article's -1e9 fill would give out[:, :, 1] == v.mean(dim=2), weights 1/5.
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    assert not torch.allclose(out[:, :, 1], v.mean(dim=2))
    if need_weights:
        assert torch.equal(weights[:, :, 1], torch.zeros(1, 2, 5))


def test_defect1_article_call_shape_gives_zero_weights_for_padded_sequence() -> None:
    """The article's call ``mha(q, k, v, mask)`` with a ``[B, 1, 1, S]`` mask."""
    mha = MultiHeadAttention(16, 4, dropout=0.0).eval()
    x = torch.randn(2, 4, 16)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])[:, None, None, :]  # sequence 2 is all padding
    out, weights = mha(x, x, x, mask, need_weights=True)
    assert torch.equal(weights[1], torch.zeros(4, 4, 4))
    assert torch.equal(weights[0, :, :, 2:], torch.zeros(4, 4, 2))
    # With nothing to attend, the attention result is zero, so the output is out_proj's bias.
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(4, 16), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_defect1_masking_in_half_precision_does_not_overflow(
    dtype: torch.dtype, need_weights: bool, mask_kind: str
) -> None:
    """The article's -1e9 overflows float16 (max 65504); attnlab uses -inf safely."""
    q, k, v = (torch.randn(2, 2, 4, 8).to(dtype).requires_grad_() for _ in range(3))
    allowed = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    if mask_kind == "bool":
        masks = {"mask": allowed}
    else:
        masks = {"attn_bias": torch.zeros(4, 4, dtype=dtype).masked_fill(~allowed, float("-inf"))}
    out, weights = attention(q, k, v, **masks, need_weights=need_weights)
    out.float().sum().backward()
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    for tensor in (q.grad, k.grad, v.grad):
        assert torch.isfinite(tensor).all()
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    if need_weights:
        assert torch.isfinite(weights).all()
        assert torch.equal(weights[..., ~allowed], torch.zeros_like(weights[..., ~allowed]))
        sums = weights.float().sum(-1)  # [B, H, T]
        torch.testing.assert_close(sums, allowed.any(-1).float().expand_as(sums), rtol=0, atol=1e-2)


def test_defect1_scaled_dot_product_attention_module() -> None:
    """The article's ``ScaledDotProductAttention(dropout)`` module, same fix."""
    module = ScaledDotProductAttention(0.1).eval()
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])[None, None]  # [1, 1, T, S]
    out, weights = module(q, k, v, mask, need_weights=True)
    assert torch.equal(out[0, 0, 1], torch.zeros(4))
    assert torch.equal(weights[0, 0, 1], torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_defect1_half_precision_module_with_fully_padded_sequence(dtype: torch.dtype, need_weights: bool) -> None:
    mha = MultiHeadAttention(16, 4, dropout=0.0, dtype=dtype)
    x = torch.randn(2, 4, 16, dtype=dtype, requires_grad=True)
    real = torch.tensor([[True, True, False, False], [False, False, False, False]])
    out, _ = mha(x, x, x, attention_mask=real, need_weights=need_weights)
    out.float().square().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    for name, parameter in mha.named_parameters():
        assert torch.isfinite(parameter.grad).all(), name
