"""``attnlab.MultiHeadAttention`` against ``torch.nn.MultiheadAttention``.

Weights are copied across explicitly (attnlab uses nn's parameter names), both modules
run in eval mode in float32, and outputs and per-head weights must agree to 1e-5.
Boolean masks have opposite polarities: attnlab's ``True`` means "may attend",
nn's ``True`` means "may not", so every bool mask is inverted at the boundary.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention
from attnlab.attention import causal_mask

ATOL = 1e-5
E, HEADS = 32, 4


def _pair(kdim: Optional[int] = None, vdim: Optional[int] = None, bias: bool = True):
    ours = MultiHeadAttention(E, HEADS, dropout=0.0, kdim=kdim, vdim=vdim, bias=bias).eval()
    theirs = nn.MultiheadAttention(E, HEADS, dropout=0.0, kdim=kdim, vdim=vdim, bias=bias, batch_first=True)
    theirs.eval()
    with torch.no_grad():
        if ours.packed:
            ours.in_proj_weight.normal_(0, 0.2)
            theirs.in_proj_weight.copy_(ours.in_proj_weight)
        else:
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                getattr(ours, name).normal_(0, 0.2)
                getattr(theirs, name).copy_(getattr(ours, name))
        ours.out_proj.weight.normal_(0, 0.2)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            ours.in_proj_bias.normal_()
            ours.out_proj.bias.normal_()
            theirs.in_proj_bias.copy_(ours.in_proj_bias)
            theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, theirs


def _compare(ours, theirs, query, key, value, *, our_kwargs, their_kwargs, rows=None):
    """Compare outputs (both paths) and per-head weights; ``rows`` limits the query rows."""
    our_out, our_weights = ours(query, key, value, need_weights=True, **our_kwargs)
    fused_out, none = ours(query, key, value, need_weights=False, **our_kwargs)
    their_out, their_weights = theirs(
        query, key, value, need_weights=True, average_attn_weights=False, **their_kwargs
    )
    assert none is None
    assert our_weights.shape == their_weights.shape == (query.shape[0], HEADS, query.shape[1], key.shape[1])
    select = slice(None) if rows is None else rows
    torch.testing.assert_close(our_out[select], their_out[select], rtol=0, atol=ATOL)
    torch.testing.assert_close(fused_out[select], their_out[select], rtol=0, atol=ATOL)
    torch.testing.assert_close(our_weights[select], their_weights[select], rtol=0, atol=ATOL)


@pytest.mark.parametrize("bias", [True, False])
def test_self_attention(bias: bool) -> None:
    ours, theirs = _pair(bias=bias)
    x = torch.randn(3, 7, E)
    _compare(ours, theirs, x, x, x, our_kwargs={}, their_kwargs={})


def test_cross_attention() -> None:
    ours, theirs = _pair()
    query, memory = torch.randn(2, 5, E), torch.randn(2, 9, E)
    _compare(ours, theirs, query, memory, memory, our_kwargs={}, their_kwargs={})


def test_cross_attention_with_kdim_vdim() -> None:
    ours, theirs = _pair(kdim=12, vdim=20)
    query, key, value = torch.randn(2, 5, E), torch.randn(2, 6, 12), torch.randn(2, 6, 20)
    _compare(ours, theirs, query, key, value, our_kwargs={}, their_kwargs={})


def test_key_padding_mask_has_opposite_polarity() -> None:
    ours, theirs = _pair()
    x = torch.randn(3, 6, E)
    real = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    _compare(
        ours, theirs, x, x, x, our_kwargs={"attention_mask": real}, their_kwargs={"key_padding_mask": ~real}
    )


def test_cross_attention_with_key_padding() -> None:
    ours, theirs = _pair(kdim=12, vdim=12)
    query, memory = torch.randn(2, 4, E), torch.randn(2, 5, 12)
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    _compare(
        ours, theirs, query, memory, memory,
        our_kwargs={"attention_mask": real}, their_kwargs={"key_padding_mask": ~real},
    )


def test_causal_flag_matches_causal_attn_mask() -> None:
    ours, theirs = _pair()
    x = torch.randn(2, 6, E)
    forbidden = ~causal_mask(6)  # nn: True = may not attend
    _compare(ours, theirs, x, x, x, our_kwargs={"is_causal": True}, their_kwargs={"attn_mask": forbidden})


def test_bool_attn_mask_has_opposite_polarity() -> None:
    ours, theirs = _pair()
    x = torch.randn(2, 6, E)
    allowed = causal_mask(6)
    _compare(ours, theirs, x, x, x, our_kwargs={"mask": allowed}, their_kwargs={"attn_mask": ~allowed})


def test_float_attn_mask_is_additive_in_both() -> None:
    ours, theirs = _pair()
    x = torch.randn(2, 6, E)
    additive = torch.randn(6, 6)
    additive[:, 4] = float("-inf")
    _compare(ours, theirs, x, x, x, our_kwargs={"attn_bias": additive}, their_kwargs={"attn_mask": additive})


def test_torch_keywords_keep_torch_meaning() -> None:
    """``attn_mask`` passed to ours means what it means to torch.nn: a drop-in call."""
    ours, theirs = _pair()
    x = torch.randn(3, 6, E)
    forbidden = ~causal_mask(6)
    forbidden[:, 0] = False
    _compare(ours, theirs, x, x, x, our_kwargs={"attn_mask": forbidden}, their_kwargs={"attn_mask": forbidden})
    additive = torch.randn(6, 6)
    additive[:, 4] = float("-inf")
    _compare(ours, theirs, x, x, x, our_kwargs={"attn_mask": additive}, their_kwargs={"attn_mask": additive})
    per_head = torch.rand(3 * HEADS, 6, 6) > 0.5
    per_head[..., 0] = False  # every row keeps a key
    _compare(ours, theirs, x, x, x, our_kwargs={"attn_mask": per_head}, their_kwargs={"attn_mask": per_head})


def test_a_float_0_1_mask_is_read_as_a_keep_mask_never_added() -> None:
    """HuggingFace's ``attention_mask.float()`` passed where attnlab takes masks."""
    ours, theirs = _pair()
    x = torch.randn(3, 6, E)
    real = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    for our_kwargs in ({"attention_mask": real.float()}, {"mask": real.float()[:, None, None, :]}):
        _compare(ours, theirs, x, x, x, our_kwargs=our_kwargs, their_kwargs={"key_padding_mask": real == 0})


def test_positional_padding_mask_when_batch_equals_length_is_refused_not_misread() -> None:
    ours, _ = _pair()
    x = torch.randn(4, 4, E)
    real = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"ambiguous.*\[B, S\] padding mask or a \[T, S\] attention mask"):
        ours(x, x, x, real)
    # and when only one reading fits, it is the one taken
    y = torch.randn(4, 5, E)
    torch.testing.assert_close(ours(y, y, y, torch.ones(4, 5, dtype=torch.bool))[0], ours(y, y, y)[0])


def test_causal_and_key_padding_together() -> None:
    ours, theirs = _pair()
    x = torch.randn(2, 6, E)
    real = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    _compare(
        ours, theirs, x, x, x,
        our_kwargs={"is_causal": True, "attention_mask": real},
        their_kwargs={"attn_mask": ~causal_mask(6), "key_padding_mask": ~real},
    )


def test_averaged_weights_match() -> None:
    ours, theirs = _pair()
    x = torch.randn(2, 6, E)
    _, our_weights = ours(x, x, x, need_weights=True, average_attn_weights=True)
    _, their_weights = theirs(x, x, x, need_weights=True, average_attn_weights=True)
    assert our_weights.shape == (2, 6, 6)
    torch.testing.assert_close(our_weights, their_weights, rtol=0, atol=ATOL)


def test_state_dict_loads_across() -> None:
    """Same parameter names: nn's state_dict loads into attnlab and gives nn's outputs."""
    theirs = nn.MultiheadAttention(E, HEADS, batch_first=True).eval()
    ours = MultiHeadAttention(E, HEADS).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, E)
    torch.testing.assert_close(ours(x, x, x)[0], theirs(x, x, x, need_weights=False)[0], rtol=0, atol=ATOL)


def test_gradients_match() -> None:
    ours, theirs = _pair()
    query, memory = torch.randn(2, 4, E), torch.randn(2, 5, E)
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    cotangent = torch.randn(2, 4, E)
    (ours(query, memory, memory, attention_mask=real)[0] * cotangent).sum().backward()
    (theirs(query, memory, memory, key_padding_mask=~real, need_weights=False)[0] * cotangent).sum().backward()
    their_params = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        expected = their_params[name].grad
        # float32 gradients summed over B*T*S terms: 1e-5 relative to the largest entry.
        atol = ATOL * max(1.0, float(expected.abs().max()))
        torch.testing.assert_close(parameter.grad, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("batch", [2, HEADS], ids=["batch_ne_heads", "batch_eq_heads"])
def test_per_sequence_mask_with_key_padding(batch: int) -> None:
    """A ``[B, T, S]`` mask combined with ``key_padding_mask`` stays per sequence.

    Regression: the two masks were broadcast as ``[B, T, S] & [B, 1, 1, S]`` into
    ``[B, B, T, S]``, which raised for ``B != H`` and silently mixed sequences'
    masks across heads for ``B == H``.
    """
    ours, theirs = _pair()
    T = 5
    x = torch.randn(batch, T, E)
    allowed = torch.rand(batch, T, T) > 0.3
    allowed[:, :, 0] = True  # every row keeps a key, so nn gives no NaN
    real = torch.ones(batch, T, dtype=torch.bool)
    real[0, 3:] = False
    their_mask = (~allowed).repeat_interleave(HEADS, dim=0)  # nn: [B * H, T, S], True = may not
    _compare(
        ours, theirs, x, x, x,
        our_kwargs={"mask": allowed, "attention_mask": real},
        their_kwargs={"attn_mask": their_mask, "key_padding_mask": ~real},
    )
