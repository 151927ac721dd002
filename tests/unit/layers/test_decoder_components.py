"""The decoder's components: RMSNorm, rotary scaling, KV cache, mask, causal attention, config."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention.rotary import RotaryEmbedding
from attnlab.layers.causal_attention import CausalSelfAttention
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.layers.decoder_mask import decoder_attention_mask
from attnlab.layers.kv_cache import KVCache
from attnlab.layers.rms_norm import RMSNorm
from attnlab.attention.rotary import ScaledRotary, apply_rotary, rotary_inverse_frequencies


def test_rms_norm_matches_a_float64_reference():
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16)
    x64 = x.double()
    expected = norm.weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(norm(x).double(), expected, atol=1e-6, rtol=1e-6)


def test_rotary_at_positions_equals_the_offset_rotary_embedding():
    x = torch.randn(2, 3, 7, 8)
    cos, sin = ScaledRotary(8)(torch.arange(4, 11).expand(2, 7))
    torch.testing.assert_close(apply_rotary(x, cos, sin), RotaryEmbedding(8)(x, offset=4))


def test_linear_scaling_divides_every_frequency():
    plain = rotary_inverse_frequencies(16, 500.0)
    scaled = rotary_inverse_frequencies(16, 500.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(scaled, plain / 4)


def test_llama3_scaling_keeps_short_wavelengths_and_divides_long_ones():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    plain = rotary_inverse_frequencies(32, 10000.0)
    scaled = rotary_inverse_frequencies(32, 10000.0, scaling)
    wavelength = 2 * math.pi / plain
    short, long = wavelength < 64 / 4, wavelength > 64 / 1
    assert short.any() and long.any()
    torch.testing.assert_close(scaled[short], plain[short])
    torch.testing.assert_close(scaled[long], plain[long] / 8)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "longrope", "factor": 2.0}, "not supported"),
    ({"rope_type": "linear"}, "needs 'factor'"),
])
def test_unsupported_rope_scaling_is_refused_by_name(scaling, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=2, d_ff=32, rope_scaling=scaling)


def test_decoder_config_refuses_kv_heads_that_do_not_divide_heads():
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=4"):
        DecoderConfig(vocab_size=10, d_model=16, num_layers=1, num_heads=4, d_ff=32, num_kv_heads=3)


def test_kv_cache_grows_without_losing_what_it_holds():
    cache = KVCache(num_layers=1)
    keys = [torch.randn(2, 1, 3 if step == 0 else 1, 4) for step in range(6)]
    for key in keys:
        stored, _ = cache.update(0, key, key)
    torch.testing.assert_close(stored, torch.cat(keys, dim=2))
    assert len(cache) == 8
    with pytest.raises(ValueError, match="one cache per batch"):
        cache.update(0, torch.randn(3, 1, 1, 4), torch.randn(3, 1, 1, 4))


def test_decoder_mask_takes_the_cheapest_form():
    assert decoder_attention_mask(None, 5, 5) == (None, True)
    assert decoder_attention_mask(None, 1, 9) == (None, False)
    mask, is_causal = decoder_attention_mask(None, 2, 6)
    assert not is_causal and mask[0, 0].tolist() == [[True] * 5 + [False], [True] * 6]  # bottom-right


def test_sliding_window_keeps_the_last_keys_only():
    mask, _ = decoder_attention_mask(None, 6, 6, sliding_window=3)
    assert mask[0, 0, 5].tolist() == [False, False, False, True, True, True]
    keep = torch.tensor([[False, True, True, True]])
    mask, _ = decoder_attention_mask(keep, 4, 4)
    assert mask.shape == (1, 1, 4, 4) and not mask[0, 0, :, 0].any()


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["multi-head", "grouped", "multi-query"])
def test_fused_and_weights_paths_agree(kv_heads):
    torch.manual_seed(0)
    attention = CausalSelfAttention(32, 4, num_kv_heads=kv_heads, qkv_bias=True)
    x = torch.randn(2, 6, 32)
    cos, sin = ScaledRotary(8)(torch.arange(6).expand(2, 6))
    fused, none = attention(x, rotary=(cos, sin), is_causal=True)
    reference, weights = attention(x, rotary=(cos, sin), is_causal=True, need_weights=True)
    assert none is None and weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(fused, reference, atol=1e-5, rtol=1e-5)
    assert not weights.triu(1).any()


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "weights"])
def test_one_new_token_reads_grouped_heads_without_copying_the_cache(need_weights):
    torch.manual_seed(0)
    attention = CausalSelfAttention(48, 6, num_kv_heads=2)
    x = torch.randn(3, 9, 48)
    cos, sin = ScaledRotary(8)(torch.arange(9).expand(3, 9))
    full, full_weights = attention(x, rotary=(cos, sin), is_causal=True, need_weights=True)
    cache = KVCache(1)
    attention(x[:, :8], rotary=(cos[:, :8], sin[:, :8]), is_causal=True, cache=cache)
    step, step_weights = attention(x[:, 8:], rotary=(cos[:, 8:], sin[:, 8:]), cache=cache, need_weights=need_weights)
    torch.testing.assert_close(step, full[:, 8:], atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(step_weights, full_weights[:, :, 8:], atol=1e-6, rtol=1e-5)


def test_swiglu_ffn_is_the_packed_gated_ffn_with_its_projections_apart():
    from attnlab.layers.ffn import GatedFFN
    from attnlab.layers.ffn import SwiGLUFFN

    torch.manual_seed(0)
    split = SwiGLUFFN(8, 12)
    packed = GatedFFN(8, 12, dropout=0.0, activation="silu", bias=False).eval()
    with torch.no_grad():
        packed.linear1.weight.copy_(torch.cat([split.gate_proj.weight, split.up_proj.weight]))
        packed.linear2.weight.copy_(split.down_proj.weight)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(split(x), packed(x), rtol=0, atol=1e-6)
