"""Inputs on another device, or of another dtype, than the weights: one line naming both.

Regression: these surfaced as torch's "mat1 and mat2 must have the same dtype, but got
Double and Float" or a device error from deep inside a layer, naming no argument.
"""

from __future__ import annotations

import pytest
import torch

from attnlab import CrossModalAttention, MultiHeadAttention, SparseAttention, TransformerEncoder
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM


def test_a_float64_input_to_float32_weights_names_both_and_the_fix():
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^query is float64 but MultiHeadAttention's weights are float32; .*"
                                         r"query\.to\(torch\.float32\) or model\.to\(torch\.float64\)"):
        MultiHeadAttention(16, 2)(x, x, x)
    with pytest.raises(ValueError, match="query is float32 but MultiHeadAttention's weights are bfloat16"):
        MultiHeadAttention(16, 2).to(torch.bfloat16)(x.float(), x.float(), x.float())
    with pytest.raises(ValueError, match="query is float64 but SparseAttention's weights are float32"):
        SparseAttention(16, 2, 4)(x, x, x)
    with pytest.raises(ValueError, match="text_features is float64 but CrossModalAttention's weights are float32"):
        CrossModalAttention(8, 16, 2)(torch.randn(2, 3, 8), x)


def test_inputs_on_another_device_name_both_devices():
    x = torch.randn(2, 5, 16, device="meta")  # a second device every machine has
    with pytest.raises(ValueError, match=r"query is on meta but MultiHeadAttention's weights are on cpu"):
        MultiHeadAttention(16, 2)(x, x, x)
    ids = torch.randint(1, 30, (2, 5)).to("meta")
    with pytest.raises(ValueError, match="input_ids is on meta but TransformerEncoder's weights are on cpu"):
        TransformerEncoder(30, 16, 1, 2, 32)(ids)
    decoder = DecoderForCausalLM(DecoderConfig(vocab_size=30, d_model=8, num_layers=1, num_heads=2, d_ff=16,
                                               max_len=16))
    with pytest.raises(ValueError, match="input_ids is on meta but DecoderForCausalLM's weights are on cpu"):
        decoder(ids)


def test_autocast_mixes_dtypes_on_purpose_and_is_let_through():
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x.bfloat16(), x.bfloat16(), x.bfloat16()).output
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
