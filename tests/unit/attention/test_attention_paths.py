"""The fused path and the reference path compute the same attention.

Both are compared with an independent float64 golden run (see ``conftest.py``): the
reference path's float32 error must stay under a documented first-order rounding
bound, and the fused path may be at most a small multiple less accurate than the
reference path. Outputs, weights and gradients of ``q``, ``k``, ``v`` (and of module
parameters) are checked for bool masks, additive float masks, causal masking and
fully masked rows.
"""

from __future__ import annotations

import copy
from typing import Optional

import pytest
import torch
from torch import Tensor

from attnlab import MultiHeadAttention
from attnlab.attention import attention, causal_mask

B, H, T, S, D = 2, 3, 5, 7, 8


def _case(kind: str) -> tuple[Optional[Tensor], bool, Optional[Tensor], Optional[Tensor]]:
    """``(mask for attnlab, is_causal, allowed for golden, additive for golden)``."""
    if kind == "none":
        return None, False, None, None
    if kind == "bool_padding":
        lengths = torch.tensor([4, 0])  # the second sequence has no key at all
        allowed = (torch.arange(S) < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
        return allowed, False, allowed, None
    if kind == "bool_random":
        allowed = torch.rand(B, H, T, S) > 0.4
        allowed[0, 1, 2] = False  # one fully masked row
        return allowed, False, allowed, None
    if kind == "int_random":
        allowed = torch.rand(B, 1, T, S) > 0.4
        allowed[1, 0, 0] = False
        return allowed.to(torch.int64), False, allowed, None
    if kind == "float_additive":
        additive = torch.randn(B, H, T, S)
        additive[torch.rand(B, H, T, S) > 0.6] = float("-inf")
        additive[1, 2, 4] = float("-inf")  # one fully masked row
        return additive, False, None, additive
    if kind == "float_keep":
        allowed = torch.rand(B, 1, T, S) > 0.4
        allowed[0, 0, 1] = False
        return allowed.float(), False, allowed, None
    if kind == "causal_flag":
        return None, True, causal_mask(T, S), None
    if kind == "causal_mask":
        return causal_mask(T, S), False, causal_mask(T, S), None
    if kind == "causal_and_padding":
        allowed = torch.ones(B, 1, 1, S, dtype=torch.bool)
        allowed[0, ..., :2] = False  # query 0 and 1 of batch 0 then have no key left
        return allowed, True, allowed & causal_mask(T, S), None
    if kind == "causal_and_float":
        additive = torch.randn(B, 1, 1, S)
        additive[0, ..., 0] = float("-inf")  # query 0 of batch 0 then has no key left
        return additive, True, causal_mask(T, S), additive
    if kind == "fully_masked":
        allowed = torch.zeros(T, S, dtype=torch.bool)
        return allowed, False, allowed, None
    raise AssertionError(kind)


KINDS = [
    "none",
    "bool_padding",
    "bool_random",
    "int_random",
    "float_additive",
    "float_keep",
    "causal_flag",
    "causal_mask",
    "causal_and_padding",
    "causal_and_float",
    "fully_masked",
]


def _as_arguments(mask):
    """Float cases are additive biases: they go in through ``attn_bias``."""
    if mask is not None and mask.dtype.is_floating_point and not bool(((mask == 0) | (mask == 1)).all()):
        return {"attn_bias": mask}
    return {"mask": mask}


def _run(q, k, v, mask, is_causal, need_weights, cotangent):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, weights = attention(q, k, v, **_as_arguments(mask), is_causal=is_causal, need_weights=need_weights)
    (out * cotangent).sum().backward()
    return out.detach(), weights, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_and_reference_match_golden(kind: str, golden) -> None:
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    cotangent = torch.randn(B, H, T, D)
    mask, is_causal, allowed, additive = _case(kind)

    fused_out, fused_weights, fused_grads = _run(q, k, v, mask, is_causal, False, cotangent)
    ref_out, ref_weights, ref_grads = _run(q, k, v, mask, is_causal, True, cotangent)
    assert fused_weights is None

    gq, gk, gv = (t.double().requires_grad_() for t in (q, k, v))
    gold_out, gold_weights = golden.attention(gq, gk, gv, allowed, additive)
    (gold_out * cotangent.double()).sum().backward()
    gold_grads = (gq.grad, gk.grad, gv.grad)

    magnitude = float(max(q.abs().max(), k.abs().max(), v.abs().max()))
    documented = golden.first_order_bound(torch.float32, D, S, magnitude)
    pairs = [("output", fused_out, ref_out, gold_out), ("weights", None, ref_weights, gold_weights)]
    pairs += [(f"grad_{n}", f, r, g) for n, f, r, g in zip("qkv", fused_grads, ref_grads, gold_grads)]
    for name, fused, ref, gold in pairs:
        ref_error = golden.max_error(ref, gold)
        assert ref_error <= documented, f"{name}: reference error {ref_error:.3g} > bound {documented:.3g}"
        if fused is None:
            continue
        bound = golden.bound(ref_error, gold, torch.float32)
        fused_error = golden.max_error(fused, gold)
        assert fused_error <= bound, f"{name}: fused error {fused_error:.3g} > {bound:.3g}"
        torch.testing.assert_close(fused, ref, rtol=0, atol=bound + ref_error)


@pytest.mark.parametrize(
    "kind", ["bool_padding", "bool_random", "float_additive", "causal_and_padding", "causal_and_float", "fully_masked"]
)
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_give_exact_zeros_forward_and_backward(kind: str, need_weights: bool, golden) -> None:
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    mask, is_causal, allowed, additive = _case(kind)
    _, gold_weights = golden.attention(q, k, v, allowed, additive)
    empty_rows = gold_weights.sum(-1) == 0  # [B, H, T]
    assert empty_rows.any()

    out, weights, (grad_q, _, _) = _run(q, k, v, mask, is_causal, need_weights, torch.randn(B, H, T, D))
    assert torch.equal(out[empty_rows], torch.zeros_like(out[empty_rows]))
    assert torch.equal(grad_q[empty_rows], torch.zeros_like(grad_q[empty_rows]))
    if need_weights:
        assert torch.equal(weights[empty_rows], torch.zeros_like(weights[empty_rows]))


@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "causal", "attn_mask_float"])
def test_multihead_parameter_gradients_agree_between_paths(mask_kind: str, golden) -> None:
    """``need_weights`` switches MultiHeadAttention between the paths; gradients agree."""
    E, heads, T_, S_ = 16, 4, 5, 6
    mha = MultiHeadAttention(E, heads, dropout=0.0).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    query, memory = torch.randn(2, T_, E), torch.randn(2, S_, E)
    kwargs: dict = {}
    mask = None
    if mask_kind == "key_padding":
        kwargs["attention_mask"] = torch.tensor([[True] * 4 + [False] * 2, [False] * S_])
    elif mask_kind == "causal":
        kwargs["is_causal"] = True
    elif mask_kind == "attn_mask_float":
        mask = torch.randn(T_, S_)
        mask[0] = float("-inf")

    def grads(module: MultiHeadAttention, dtype: torch.dtype, need_weights: bool) -> dict[str, Tensor]:
        module.zero_grad()
        q = query.to(dtype).clone().requires_grad_()
        m = memory.to(dtype).clone().requires_grad_()
        attn_bias = None if mask is None else mask.to(dtype)
        out, _ = module(q, m, m, attn_bias=attn_bias, need_weights=need_weights, **kwargs)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
        found = {name: p.grad.clone() for name, p in module.named_parameters()}
        found.update(output=out.detach(), grad_query=q.grad, grad_memory=m.grad)
        return found

    fused = grads(mha, torch.float32, need_weights=False)
    reference = grads(mha, torch.float32, need_weights=True)
    gold = grads(copy.deepcopy(mha).double(), torch.float64, need_weights=True)
    assert fused.keys() == reference.keys() == gold.keys()
    for name in gold:
        ref_error = golden.max_error(reference[name], gold[name])
        bound = golden.bound(ref_error, gold[name], torch.float32)
        fused_error = golden.max_error(fused[name], gold[name])
        assert fused_error <= bound, f"{name}: fused error {fused_error:.3g} > {bound:.3g}"
        assert torch.isfinite(fused[name]).all() and torch.isfinite(reference[name]).all()


def test_explicit_scale_is_used_by_both_paths(golden) -> None:
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    fused, _ = attention(q, k, v, scale=0.3)
    ref, _ = attention(q, k, v, scale=0.3, need_weights=True)
    # Scaling q by 0.3 * sqrt(D) turns the default 1/sqrt(D) scale into 0.3.
    gold, _ = golden.attention(q * 0.3 * 2.0, k, v)
    torch.testing.assert_close(fused, gold.float(), rtol=0, atol=1e-5)
    torch.testing.assert_close(ref, gold.float(), rtol=0, atol=1e-5)


def test_empty_key_sequence_gives_zero_output() -> None:
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 6)
    for need_weights in (False, True):
        out, weights = attention(q, k, v, need_weights=need_weights)
        assert out.shape == (1, 2, 3, 6)
        assert torch.equal(out, torch.zeros_like(out))
        if need_weights:
            assert weights.shape == (1, 2, 3, 0)


def test_reference_path_finds_rows_emptied_by_mask_and_causality_together() -> None:
    # Regression: empty rows were once found from the mask alone, so a row the mask
    # allows only a later key in, and causality then empties, came out NaN.
    from attnlab.attention import reference_attention

    q = k = v = torch.randn(1, 1, 3, 4, requires_grad=True)
    mask = torch.tensor([[False, False, True], [True, True, True], [True, True, True]])[None, None]
    out, weights = reference_attention(q, k, v, mask, is_causal=True)
    assert torch.isfinite(out).all() and not out[0, 0, 0].any() and not weights[0, 0, 0].any()
    torch.testing.assert_close(weights[0, 0, 1:].sum(-1), torch.ones(2))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_reference_path_survives_a_float16_mask_that_overflows_to_minus_infinity() -> None:
    # finfo(float16).min plus a negative score is -inf in float16: the row is empty.
    q = torch.full((1, 1, 1, 4), 8.0, dtype=torch.float16)
    k = v = torch.full((1, 1, 3, 4), -8.0, dtype=torch.float16)
    mask = torch.full((1, 1, 1, 3), torch.finfo(torch.float16).min, dtype=torch.float16)
    out, weights = attention(q, k, v, attn_bias=mask, need_weights=True)
    assert torch.isfinite(weights).all() and torch.isfinite(out).all()
    assert not weights.any()
