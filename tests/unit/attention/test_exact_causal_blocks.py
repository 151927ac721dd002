"""exact_attention's plain causal map, computed block by block of query rows against the keys up
to each block's last row (the native in-place softmax on grouped products, and torch's ops where
the kernel does not serve): the weights and outputs of a float64 eager-order reference, for
grouped, multi- and single-key-value heads, batches, more keys than queries, small blocks handed
to a callback, and (on the masked path beside it) padding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.attention import exact
from attnlab.attention.exact import exact_attention

needs_kernel = pytest.mark.skipif(exact._in_place_causal_softmax() is None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")


def _reference(query, key, value, keep=None):
    """Eager's order in float64: repeated key-value heads, scaled products, top-left causal
    mask (and ``keep [B, S]``, True on real keys), softmax, weights @ values; a row with no key
    gets zeros. Returns ``(output [B, T, H, D], weights [B, H, T, S])``."""
    B, H, T, D = query.shape
    groups = H // key.shape[1]
    key, value = (tensor.double().repeat_interleave(groups, dim=1) for tensor in (key, value))
    scores = query.double() @ key.transpose(-2, -1) * D ** -0.5  # [B, H, T, S]
    allowed = torch.arange(key.shape[2])[None, :] <= torch.arange(T)[:, None]  # [T, S]
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return (weights @ value).transpose(1, 2), weights


def _inputs(B, H, K, T, S, D=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=generator), torch.randn(B, K, S, D, generator=generator),
            torch.randn(B, K, S, D, generator=generator))


@pytest.mark.parametrize("softmax", ["native", "torch"])
@pytest.mark.parametrize("B, H, K, T, S", [(2, 8, 2, 150, 150), (1, 4, 4, 130, 130), (3, 6, 1, 97, 97),
                                           (2, 4, 2, 80, 100)])
def test_causal_blocks_equal_a_float64_reference(monkeypatch, softmax, B, H, K, T, S):
    if softmax == "torch":
        monkeypatch.setattr(exact, "_in_place_causal_softmax", lambda: None)
    elif exact._in_place_causal_softmax() is None:
        pytest.skip("the native kernel cannot be built here")
    query, key, value = _inputs(B, H, K, T, S, seed=T + K)
    with torch.no_grad():
        output, weights = exact_attention(nn.Module(), query, key, value, None, scaling=None, causal=True,
                                          keep_weights=True)
    want_output, want_weights = _reference(query, key, value)
    assert weights.shape == (B, H, T, S) and output.shape == (B, T, H, query.shape[-1])
    assert output.is_contiguous()
    assert (weights.double() - want_weights).abs().max() < 1e-6
    assert (output.double() - want_output).abs().max() < 1e-5
    assert bool((weights.triu(1) == 0).all())  # nothing above the diagonal


@needs_kernel
def test_small_blocks_reach_the_callback_with_their_own_rows():
    # The statistics mode's small blocks: each handed over before the next block reuses the
    # scratch buffer, ending at its last row's key.
    query, key, value = _inputs(2, 8, 2, 100, 100, seed=3)
    seen = []
    with torch.no_grad():
        output, weights = exact_attention(
            nn.Module(), query, key, value, None, scaling=None, causal=True, rows_per_block=7,
            on_block=lambda block, start, T, S: seen.append((start, block.clone())))
    want_output, want_weights = _reference(query, key, value)
    assert weights is None
    assert (output.double() - want_output).abs().max() < 1e-5
    assert [start for start, _ in seen] == list(range(0, 100, 7))
    for start, block in seen:
        t, keys = block.shape[-2:]
        assert keys == min(100, start + t)
        assert (block.double() - want_weights[:, :, start:start + t, :keys]).abs().max() < 1e-6


@needs_kernel
def test_the_products_take_contiguous_operands(monkeypatch):
    # Regression: the products were written straight into views of the kept map (rows S apart),
    # which torch splits into one small GEMM per head, each a parallel region of its own: 4.8 s
    # instead of 0.25 s per layer of 32 heads at T = 1024 on 2 busy cores.
    bmm, calls = torch.bmm, []

    def checked(first, second, *, out=None):
        calls.append(first.is_contiguous() and (out is None or out.is_contiguous()))
        return bmm(first, second, out=out)

    monkeypatch.setattr(torch, "bmm", checked)
    query, key, value = _inputs(1, 8, 2, 150, 150)
    with torch.no_grad():
        exact_attention(nn.Module(), query, key, value, None, scaling=None, causal=True, keep_weights=True)
    assert calls and all(calls)


def test_a_padded_causal_batch_equals_the_reference():
    # Padding goes through the masked path beside the blocks: the same rule, zeros for a row
    # with no real key.
    query, key, value = _inputs(2, 8, 2, 90, 90, seed=5)
    keep = torch.ones(2, 90, dtype=torch.bool)
    keep[1, :20] = False  # left padding
    with torch.no_grad():
        output, weights = exact_attention(nn.Module(), query, key, value, keep[:, None, None, :], scaling=None,
                                          causal=True, keep_weights=True)
    want_output, want_weights = _reference(query, key, value, keep)
    assert (weights.double() - want_weights).abs().max() < 1e-6
    assert (output.double() - want_output).abs().max() < 1e-5
