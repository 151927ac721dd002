"""attnlab's modules call one attention function looked up by name (attnlab.attention.interface)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import MultiHeadAttention
from attnlab.attention import ScaledDotProductAttention
from attnlab.attention.disentangled import DisentangledSelfAttention, RelativePositionTable
from attnlab.attention.interface import (
    ATTENTION_FUNCTIONS,
    head_scale_of,
    sdpa_attention_function,
    set_head_scale,
    use_attention_function,
)
from attnlab.layers.causal_attention import CausalSelfAttention


def _modules():
    torch.manual_seed(0)
    table = RelativePositionTable(4, 16)
    return {
        "multihead": MultiHeadAttention(16, 4, dropout=0.0),
        "causal (grouped heads)": CausalSelfAttention(16, 4, num_kv_heads=2),
        "disentangled": DisentangledSelfAttention(16, 4, positions=table, owns_positions=True),
    }


def _call(name, module, x):
    if name.startswith("causal"):
        return module(x, is_causal=True, need_weights=True)
    return module(x, x, x, need_weights=True)


@pytest.mark.parametrize("name", list(_modules()))
def test_every_module_calls_the_function_its_attn_implementation_names(name):
    module = _modules()[name].eval()
    x = torch.randn(2, 5, 16)
    expected_out, expected_weights = _call(name, module, x)
    calls = []

    def traced(called, query, key, value, mask=None, **options):
        calls.append((called, tuple(query.shape), tuple(key.shape)))
        return sdpa_attention_function(called, query, key, value, mask, **options)

    ATTENTION_FUNCTIONS.register("traced", traced)
    with use_attention_function(module, "traced") as switched:
        assert switched == [module] and module.attn_implementation == "traced"
        out, weights = _call(name, module, x)
    kv_heads = 2 if name.startswith("causal") else 4
    assert calls == [(module, (2, 4, 5, 4), (2, kv_heads, 5, 4))]
    assert torch.equal(out, expected_out) and torch.equal(weights, expected_weights)
    assert module.attn_implementation == "sdpa" and "attn_implementation" not in vars(module)


def test_an_unknown_function_is_refused_in_one_line_before_anything_changes():
    module = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"^no attention function 'fast'; registered: .*sdpa.* \(register one"):
        with use_attention_function(module, "fast"):
            pass
    assert module.attn_implementation == "sdpa"
    with pytest.raises(TypeError, match="must be callable"):
        ATTENTION_FUNCTIONS.register("broken", 3)


@pytest.mark.parametrize("length", [1, 4])  # one new token (grouped rows), and a prompt (keys repeated)
def test_the_sdpa_function_serves_grouped_heads_as_torch_does(length):
    torch.manual_seed(0)
    query = torch.randn(2, 6, length, 8, dtype=torch.float64)
    key, value = torch.randn(2, 2, 7, 8, dtype=torch.float64), torch.randn(2, 2, 7, 8, dtype=torch.float64)
    module = ScaledDotProductAttention(dropout=0.0)
    out, weights = sdpa_attention_function(module, query, key, value, need_weights=True)
    repeated_key, repeated_value = key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1)
    expected = F.scaled_dot_product_attention(query, repeated_key, repeated_value)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, torch.softmax(query @ repeated_key.transpose(-1, -2) / 8 ** 0.5, -1))


def test_a_head_scale_set_from_outside_equals_the_head_mask_keyword():
    torch.manual_seed(0)
    module = MultiHeadAttention(16, 4, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    row = torch.tensor([1.0, 0.0, 0.5, 1.0])
    expected_out, expected_weights = module(x, x, x, need_weights=True, head_mask=row)
    set_head_scale(module, row)
    try:
        out, weights = module(x, x, x, need_weights=True)
    finally:
        set_head_scale(module, None)
    assert head_scale_of(module) is None
    assert torch.equal(out, expected_out) and torch.equal(weights, expected_weights)
    assert weights[:, 1].abs().max() == 0
    plain, _ = module(x, x, x)
    assert not torch.allclose(plain, out)
