"""The native decoding step's optional pieces (query/key norms, post norms, a missing pre-norm,
windows with their own angles, soft-capping) under bfloat16 and float16 matrices and cache: the
same logits as float32 matrices holding the same rounded values, up to the rounding of the new
token's key and value into the cache; their 1-d weights stay float32, as every norm weight."""

from __future__ import annotations

import pytest
import torch

from attnlab import _native
from attnlab._dispatch import native_unavailable_reason

pytestmark = pytest.mark.skipif(native_unavailable_reason("decode_step") is not None,
                                reason="the native kernel cannot be built here (no compiler or ninja)")

B, H, K, D, E, F, V, C, SLOT, LAYERS = 2, 4, 2, 8, 32, 48, 50, 10, 6, 2


def _pieces(dtype: torch.dtype):
    """The step's arguments with matrices and caches in ``dtype`` (values rounded to bfloat16,
    then float16, first: every dtype holds them exactly), the rest float32."""
    generator = torch.Generator().manual_seed(0)

    def rounded(values):
        return values.to(torch.bfloat16).to(torch.float16).to(dtype)

    def matrix(rows, columns):
        return rounded(torch.randn(rows, columns, generator=generator) * 0.3)

    def vector(size, mean=0.0):
        return mean + 0.2 * torch.randn(size, generator=generator)

    weights = []
    for layer in range(LAYERS):
        weights += [None if layer == 1 else vector(E, 1.0), None,  # layer 1: no norm before attention
                    matrix((H + 2 * K) * D, E), vector((H + 2 * K) * D),
                    matrix(E, H * D), None, vector(E, 1.0), None,
                    matrix(F, E), None, matrix(F, E), None, matrix(E, F), None]
    weights += [vector(E, 1.0), None, matrix(V, E), None]
    extras = []
    for _ in range(LAYERS):  # the query norm per head, the key norm over all heads, both post norms
        extras += [vector(D, 1.0), vector(K * D, 1.0), vector(E, 1.0), vector(E, 1.0)]
    caches = [rounded(torch.randn(B, K, C, D, generator=generator)) for _ in range(2 * LAYERS)]
    angles = torch.rand(B, D // 2, generator=generator) * 3
    local = angles / 7
    x = torch.randn(B, E, generator=generator)
    allowed = torch.zeros(B, C, dtype=torch.bool)
    allowed[:, : SLOT + 1] = True
    allowed[1, 0] = False  # a padded slot
    rotary = [torch.cat((a, a), dim=-1) for a in (angles.cos(), angles.sin(), local.cos(), local.sin())]
    return x, rotary, allowed, weights, caches[:LAYERS], caches[LAYERS:], extras


def _step(dtype: torch.dtype, optional: bool = True, extras_dtype: torch.dtype = torch.float32):
    x, (cos, sin, cos_local, sin_local), allowed, weights, keys, values, extras = _pieces(dtype)
    pieces = dict(extras=[extra.to(extras_dtype) for extra in extras], windows=[3, 0], cos_local=cos_local,
                  sin_local=sin_local, attention_softcap=5.0, logit_softcap=3.0) if optional else {}
    if not optional:  # layer 1's attention pre-norm back (Entry: 14 per layer, the pre-norm's weight first)
        weights = [torch.ones(E) if index == 14 else weight for index, weight in enumerate(weights)]
    logits, _ = _native.build("decode_step").step(x, cos, sin, allowed, SLOT, weights, keys, values,
                                                  [D ** -0.5] * LAYERS, H, K, 0, 1e-6, 0, False, **pieces)
    return logits, keys


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_the_optional_pieces_serve_half_width_matrices(dtype):
    half, half_keys = _step(dtype)
    full, full_keys = _step(torch.float32)
    assert half.dtype == torch.float32 and half.shape == (B, V)
    assert half_keys[0].dtype == dtype
    # the new slot rounded to the cache's dtype: the only difference between the two runs
    assert torch.allclose(half_keys[0][:, :, SLOT].float(), full_keys[0][:, :, SLOT], rtol=1e-2, atol=1e-2)
    assert float((half - full).abs().max()) < 0.02
    plain, _ = _step(dtype, optional=False)
    assert float((half - plain).abs().max()) > 0.2  # the optional pieces did change the step


def test_half_width_extras_are_refused():
    with pytest.raises(RuntimeError, match="every extra weight must be a contiguous float32"):
        _step(torch.bfloat16, extras_dtype=torch.bfloat16)
