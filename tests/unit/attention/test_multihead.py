"""MultiHeadAttention and ScaledDotProductAttention behaviour beyond nn parity."""

from __future__ import annotations

import pytest
import torch

from attnlab import MultiHeadAttention, ScaledDotProductAttention
from attnlab.attention import causal_mask

E, HEADS, D = 16, 4, 4


def test_article_call_unpacks_and_weights_only_when_asked() -> None:
    mha = MultiHeadAttention(E, HEADS).eval()
    x = torch.randn(2, 5, E)
    mask = torch.ones(2, 1, 1, 5)
    output, weights = mha(x, x, x, mask)
    assert output.shape == (2, 5, E) and weights is None
    output, weights = mha(x, x, x, mask, need_weights=True)
    assert weights.shape == (2, HEADS, 5, 5)


def test_averaged_weights_are_the_head_mean() -> None:
    mha = MultiHeadAttention(E, HEADS).eval()
    x = torch.randn(2, 5, E)
    _, per_head = mha(x, x, x, need_weights=True)
    _, averaged = mha(x, x, x, need_weights=True, average_attn_weights=True)
    torch.testing.assert_close(averaged, per_head.mean(dim=1))


def test_head_mask_zeroes_one_head() -> None:
    """Ablating head 1 equals zeroing that head's input columns of ``out_proj``."""
    mha = MultiHeadAttention(E, HEADS, dropout=0.0).eval()
    x = torch.randn(2, 5, E)
    head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0])
    out, weights = mha(x, x, x, need_weights=True, head_mask=head_mask)
    fused_out, _ = mha(x, x, x, head_mask=head_mask)
    assert torch.equal(weights[:, 1], torch.zeros(2, 5, 5))
    with torch.no_grad():
        mha.out_proj.weight[:, D : 2 * D] = 0.0
    expected, full_weights = mha(x, x, x, need_weights=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused_out, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(weights[:, [0, 2, 3]], full_weights[:, [0, 2, 3]])


def test_head_mask_per_sequence() -> None:
    mha = MultiHeadAttention(E, HEADS, dropout=0.0).eval()
    x = torch.randn(2, 5, E)
    head_mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])  # [B, H]
    out, _ = mha(x, x, x, head_mask=head_mask)
    torch.testing.assert_close(out[0], mha(x, x, x)[0][0])
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(5, E))
    with pytest.raises(ValueError, match=r"head_mask must be \[H\]=\[4\] or \[B, H\]=\[2, 4\], got \(3,\)"):
        mha(x, x, x, head_mask=torch.ones(3))


def test_self_attention_uses_packed_projection_same_as_separate_inputs() -> None:
    mha = MultiHeadAttention(E, HEADS).eval()
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(mha(x, x, x)[0], mha(x, x.clone(), x.clone())[0], rtol=0, atol=1e-6)


def test_parameters_follow_torch_names() -> None:
    packed = dict(MultiHeadAttention(E, HEADS).named_parameters())
    assert set(packed) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
    separate = dict(MultiHeadAttention(E, HEADS, kdim=6, vdim=10).named_parameters())
    assert separate["k_proj_weight"].shape == (E, 6) and separate["v_proj_weight"].shape == (E, 10)
    assert "in_proj_weight" not in separate
    assert set(dict(MultiHeadAttention(E, HEADS, bias=False).named_parameters())) == {
        "in_proj_weight", "out_proj.weight"
    }


def test_device_and_dtype_are_passed_through() -> None:
    mha = MultiHeadAttention(E, HEADS, kdim=6, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in mha.parameters())
    x = torch.randn(1, 3, E, dtype=torch.float64)
    out, _ = mha(x, torch.randn(1, 2, 6, dtype=torch.float64), torch.randn(1, 2, E, dtype=torch.float64))
    assert out.dtype == torch.float64


def test_dropout_active_in_training_only() -> None:
    mha = MultiHeadAttention(E, HEADS, dropout=0.5)
    x = torch.randn(2, 6, E)
    mha.train()
    assert not torch.allclose(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.eval()
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])


def test_integer_float_and_bool_attention_masks_agree() -> None:
    mha = MultiHeadAttention(E, HEADS).eval()
    x = torch.randn(2, 4, E)
    real = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    expected, _ = mha(x, x, x, attention_mask=real.bool())
    torch.testing.assert_close(mha(x, x, x, attention_mask=real)[0], expected)
    torch.testing.assert_close(mha(x, x, x, attention_mask=real.float())[0], expected)
    additive = torch.zeros(2, 4).masked_fill(real == 0, float("-inf"))
    torch.testing.assert_close(mha(x, x, x, attn_bias=additive[:, None, None, :])[0], expected)


def test_causal_flag_equals_causal_mask() -> None:
    mha = MultiHeadAttention(E, HEADS).eval()
    x = torch.randn(2, 5, E)
    for need_weights in (False, True):
        flagged, _ = mha(x, x, x, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(flagged, mha(x, x, x, causal_mask(5), need_weights=need_weights)[0])


def test_scaled_dot_product_attention_module() -> None:
    module = ScaledDotProductAttention(0.5)
    q = k = v = torch.randn(1, 2, 4, 8)
    assert module(q, k, v)[1] is None
    module.eval()
    out, weights = module(q, k, v, need_weights=True)
    assert weights.shape == (1, 2, 4, 4)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 4))
    torch.testing.assert_close(module(q, k, v)[0], out, rtol=0, atol=1e-6)
