"""Property tests (hypothesis) of the attention kernel over random shapes, masks and dtypes.

For every drawn case: no NaN or Inf in outputs, weights or gradients; fused and
reference paths agree within a tolerance derived from a float64 golden run; weight
rows sum to 1 (0 for rows with no admissible key); masked keys get exactly 0 weight.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import attention, causal_mask

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
# Row sums of weights stored in ``dtype``: S roundings of at most eps/2 each, and slack.
ROW_SUM_SLACK = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}


@st.composite
def attention_cases(draw):
    B = draw(st.integers(1, 3))
    H = draw(st.integers(1, 4))
    T = draw(st.integers(1, 7))
    S = draw(st.integers(1, 7))
    D = draw(st.sampled_from([1, 2, 4, 8]))
    dtype = draw(st.sampled_from(DTYPES))
    kind = draw(st.sampled_from(["none", "padding", "causal", "random", "random_float", "empty_rows"]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    mask, is_causal, allowed = None, False, torch.ones(B, 1, T, S, dtype=torch.bool)
    if kind == "padding":
        lengths = torch.randint(0, S + 1, (B,), generator=generator)  # 0 = fully padded
        mask = (torch.arange(S) < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
        allowed = mask.expand(B, 1, T, S)
    elif kind == "causal":
        is_causal = True
        allowed = causal_mask(T, S).expand(B, 1, T, S)
        if draw(st.booleans()):  # causal on top of padding
            lengths = torch.randint(0, S + 1, (B,), generator=generator)
            mask = (torch.arange(S) < lengths[:, None])[:, None, None, :]
            allowed = allowed & mask
    elif kind == "random":
        mask = torch.rand(B, H, T, S, generator=generator) > 0.5
        allowed = mask
    elif kind == "random_float":
        keep = torch.rand(B, H, T, S, generator=generator) > 0.5
        mask = torch.randn(B, H, T, S, generator=generator).masked_fill(~keep, float("-inf")).to(dtype)
        allowed = keep
    elif kind == "empty_rows":
        rows = torch.rand(B, 1, T, 1, generator=generator) > 0.5
        keys = torch.rand(B, 1, T, S, generator=generator) > 0.3
        mask = keys & rows  # rows drawn False have no key
        allowed = mask
    q = torch.randn(B, H, T, D, generator=generator).to(dtype)
    k = torch.randn(B, H, S, D, generator=generator).to(dtype)
    v = torch.randn(B, H, S, D, generator=generator).to(dtype)
    return q, k, v, mask, is_causal, allowed.expand(B, H, T, S), kind


def _forward_backward(q, k, v, mask, is_causal, need_weights, cotangent):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    masks = {"attn_bias": mask} if mask is not None and mask.dtype.is_floating_point else {"mask": mask}
    out, weights = attention(q, k, v, **masks, is_causal=is_causal, need_weights=need_weights)
    (out * cotangent).sum().backward()
    return out.detach(), weights, [q.grad, k.grad, v.grad]


@settings(max_examples=60)
@given(case=attention_cases())
def test_attention_properties(case, golden) -> None:
    q, k, v, mask, is_causal, allowed, kind = case
    dtype = q.dtype
    cotangent = torch.ones_like(q[..., :1]).expand_as(q) / q.shape[-1]
    fused_out, fused_weights, fused_grads = _forward_backward(q, k, v, mask, is_causal, False, cotangent)
    ref_out, weights, ref_grads = _forward_backward(q, k, v, mask, is_causal, True, cotangent)

    assert fused_weights is None
    for tensor in [fused_out, ref_out, weights, *fused_grads, *ref_grads]:
        assert torch.isfinite(tensor).all(), kind

    # Masked keys get exactly zero weight; rows sum to 1, or 0 when no key is allowed.
    assert torch.equal(weights[~allowed], torch.zeros_like(weights[~allowed]))
    has_key = allowed.any(-1)
    row_sums = weights.double().sum(-1)
    expected = has_key.double()
    assert torch.allclose(row_sums, expected, rtol=0, atol=ROW_SUM_SLACK[dtype])
    assert torch.equal(fused_out[~has_key], torch.zeros_like(fused_out[~has_key]))

    # Fused vs reference, against a float64 golden run.
    additive = mask if mask is not None and mask.dtype.is_floating_point else None
    gq, gk, gv = (t.double().requires_grad_() for t in (q, k, v))
    gold_out, _ = golden.attention(gq, gk, gv, None if additive is not None else allowed, additive)
    (gold_out * cotangent.double()).sum().backward()
    named = zip(
        ["output", "grad_q", "grad_k", "grad_v"],
        [fused_out, *fused_grads],
        [ref_out, *ref_grads],
        [gold_out, gq.grad, gk.grad, gv.grad],
    )
    # The bound scales with the dtype's eps (and the reference path's own error), so
    # bfloat16, with 8 significant bits, is held to a correspondingly looser tolerance.
    for name, fused, ref, gold in named:
        ref_error = golden.max_error(ref, gold)
        bound = golden.bound(ref_error, gold, dtype)
        fused_error = golden.max_error(fused, gold)
        assert fused_error <= bound, f"{kind} {dtype} {name}: fused {fused_error:.3g} > {bound:.3g}"
        assert golden.max_error(fused, ref) <= bound + ref_error
