"""Rotary position embedding: relative, norm-preserving, the documented layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import MultiHeadAttention, RotaryEmbedding

D, T = 16, 12


def _repeat_over_positions(vector: torch.Tensor) -> torch.Tensor:
    return vector.expand(1, 1, T, D)  # the same vector at every position


def test_rotated_dot_product_depends_only_on_distance() -> None:
    rotary = RotaryEmbedding(D)
    q = rotary(_repeat_over_positions(torch.randn(D)).double())[0, 0]  # [T, D]
    k = rotary(_repeat_over_positions(torch.randn(D)).double())[0, 0]
    scores = q @ k.T  # scores[m, n] = f(m - n) only
    for m in range(T - 1):
        for n in range(T - 1):
            torch.testing.assert_close(scores[m + 1, n + 1], scores[m, n], rtol=0, atol=1e-5)
    assert not torch.allclose(scores[0, 0], scores[0, 1])  # it does depend on the distance


def test_rotation_preserves_norms() -> None:
    x = torch.randn(2, 3, T, D)
    rotated = RotaryEmbedding(D)(x)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rotated[:, :, 0], x[:, :, 0])  # position 0 is not rotated


def test_rotation_matches_rotate_half_formula() -> None:
    """Pairs ``(i, i + D/2)`` turn by ``position * base^(-2i/D)``, computed in float64."""
    base = 500.0
    x = torch.randn(1, 1, T, D, dtype=torch.float64)
    out = RotaryEmbedding(D, base)(x)[0, 0]
    half = D // 2
    for pos in range(T):
        for i in range(half):
            angle = torch.tensor(pos * base ** (-2 * i / D), dtype=torch.float64)
            a, b = x[0, 0, pos, i], x[0, 0, pos, i + half]
            torch.testing.assert_close(out[pos, i], a * angle.cos() - b * angle.sin(), rtol=0, atol=1e-5)
            torch.testing.assert_close(out[pos, i + half], b * angle.cos() + a * angle.sin(), rtol=0, atol=1e-5)


def test_offset_continues_positions() -> None:
    rotary = RotaryEmbedding(D)
    x = torch.randn(1, 2, T, D)
    torch.testing.assert_close(rotary(x[:, :, 5:], offset=5), rotary(x)[:, :, 5:])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"rotary embedding needs an even head_dim, got 7"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"head_dim must be a positive int, got 0"):
        RotaryEmbedding(0)
    with pytest.raises(ValueError, match=r"x must be \[B, H, T, 16\], got shape \(2, 12, 16\)"):
        RotaryEmbedding(D)(torch.randn(2, T, D))


def test_rotary_attention_is_translation_invariant() -> None:
    """With rotary positions (and no other), shifting every position leaves attention unchanged."""
    mha = MultiHeadAttention(32, 2, dropout=0.0, rotary=True).eval()
    x = torch.randn(1, 6, 32)
    _, weights = mha(x, x, x, need_weights=True)
    assert weights.shape == (1, 2, 6, 6)
    w_q, w_k, _ = mha.in_proj_weight.chunk(3)
    b_q, b_k, _ = mha.in_proj_bias.chunk(3)
    q = F.linear(x, w_q, b_q).view(1, 6, 2, 16).transpose(1, 2)  # [B, H, T, D]
    k = F.linear(x, w_k, b_k).view(1, 6, 2, 16).transpose(1, 2)  # [B, H, T, D]
    for offset in (0, 7):
        scores = mha.rotary(q, offset=offset) @ mha.rotary(k, offset=offset).transpose(-2, -1)
        torch.testing.assert_close(torch.softmax(scores / 4.0, -1), weights, rtol=0, atol=1e-5)


def test_table_made_under_inference_mode_does_not_break_a_later_backward() -> None:
    # The cos/sin table is cached; one built under inference_mode cannot be saved for
    # autograd, so a training step after an evaluation must rebuild it, not fail.
    rotary = RotaryEmbedding(8)
    with torch.inference_mode():
        rotary(torch.randn(1, 2, 16, 8))
    x = torch.randn(1, 2, 16, 8, requires_grad=True)
    rotary(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_longer_inputs_grow_the_cached_table_with_the_same_angles() -> None:
    rotary = RotaryEmbedding(8, base=500.0)
    x = torch.randn(1, 1, 300, 8, dtype=torch.float64)
    rotary(x[:, :, :5])  # caches a short table first
    positions = torch.arange(300, dtype=torch.float64)[:, None]
    angles = positions * 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    expected = x * cos + torch.cat((-x[..., 4:], x[..., :4]), -1) * sin
    torch.testing.assert_close(rotary(x), expected, atol=1e-5, rtol=0)


def test_rotate_positions_rotates_packed_rows_as_their_sequences_would() -> None:
    rotary = RotaryEmbedding(8)
    first, second = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8)
    packed = torch.cat((first[0].transpose(0, 1), second[0].transpose(0, 1)))  # [8, H, D]
    positions = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    rotated = rotary.rotate_positions(packed, positions)
    torch.testing.assert_close(rotated[:5], rotary(first)[0].transpose(0, 1))
    torch.testing.assert_close(rotated[5:], rotary(second)[0].transpose(0, 1))


def test_encoder_and_decoder_rotary_share_one_frequency_formula() -> None:
    from attnlab.attention.rotary import ScaledRotary, rotary_parameters

    exact = 500.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    encoder = RotaryEmbedding(16, 500.0).inv_freq
    assert encoder.dtype == torch.float32
    torch.testing.assert_close(encoder, exact.float(), rtol=0, atol=0)  # the nearest float32
    torch.testing.assert_close(encoder, rotary_parameters(16, 500.0, dtype=torch.float64)[0], rtol=0, atol=0)
    # the decoder's: HuggingFace's float32 arithmetic, bit for bit
    hf = 1.0 / (500.0 ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16))
    torch.testing.assert_close(ScaledRotary(16, 500.0).inv_freq, hf, rtol=0, atol=0)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        rotary_parameters(16, dtype=torch.bfloat16)
