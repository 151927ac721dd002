"""Mask builders and validation: masks keep (``True`` / 1 = may attend, any dtype), biases add."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.attention import (
    causal_mask,
    combine_masks,
    from_torch_mask,
    mask_to_additive,
    mask_with_bias,
    padding_mask,
    padding_mask_from_ids,
    padding_to_attention_mask,
    validate_attention_bias,
    validate_attention_mask,
)

INF = float("-inf")


def test_padding_mask_from_lengths() -> None:
    expected = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    assert torch.equal(padding_mask([2, 3, 0]), expected)
    assert torch.equal(padding_mask(torch.tensor([2, 3, 0])), expected)
    assert padding_mask([1, 2], max_len=5).shape == (2, 5)


@pytest.mark.parametrize(
    ("lengths", "max_len", "error", "match"),
    [
        ([[1, 2]], None, ValueError, r"lengths must be 1-D \[B\], got shape \(1, 2\)"),
        ([1.0, 2.0], None, TypeError, r"lengths must hold integers, got dtype torch.float32"),
        ([1, -1], None, ValueError, r"lengths must be >= 0, got \[1, -1\]"),
        ([1, 4], 3, ValueError, r"max_len=3 is shorter than the longest length 4"),
    ],
)
def test_padding_mask_rejects_bad_lengths(lengths, max_len, error, match) -> None:
    with pytest.raises(error, match=match):
        padding_mask(lengths, max_len=max_len)


def test_padding_mask_from_ids() -> None:
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 8, 0]])
    assert torch.equal(padding_mask_from_ids(ids, 0), ids != 0)
    with pytest.raises(ValueError, match=r"input_ids must be \[B, S\], got shape \(4,\)"):
        padding_mask_from_ids(ids[0], 0)


@pytest.mark.parametrize(("T", "S"), [(4, 4), (3, 5), (5, 3)])
def test_causal_mask_matches_sdpa_is_causal(T: int, S: int) -> None:
    mask = causal_mask(T, S)
    assert mask.shape == (T, S) and mask.dtype == torch.bool
    for i in range(T):
        for j in range(S):
            assert bool(mask[i, j]) == (j <= i)
    q, k, v = torch.randn(1, 1, T, 4), torch.randn(1, 1, S, 4), torch.randn(1, 1, S, 4)
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )
    assert torch.equal(causal_mask(T), causal_mask(T, T))


def test_padding_to_attention_mask() -> None:
    mask = padding_mask([1, 2])
    assert torch.equal(padding_to_attention_mask(mask), mask[:, None, None, :])
    with pytest.raises(ValueError, match=r"padding mask must be \[B, S\], got shape \(2, 1, 2\)"):
        padding_to_attention_mask(mask[:, None])


def test_mask_to_additive() -> None:
    additive = mask_to_additive(torch.tensor([True, False]), torch.float64)
    assert additive.dtype == torch.float64
    assert additive.tolist() == [0.0, INF]
    with pytest.raises(TypeError, match=r"expects a bool mask, got torch.float32"):
        mask_to_additive(torch.zeros(2), torch.float32)


def test_combine_bool_masks_is_logical_and() -> None:
    padding = padding_mask([2, 3])[:, None, None, :]  # [B, 1, 1, S]
    causal = causal_mask(3)  # [T, S]
    combined = combine_masks(padding, None, causal)
    assert combined.dtype == torch.bool and combined.shape == (2, 1, 3, 3)
    assert torch.equal(combined, padding & causal)
    assert torch.equal(combine_masks(torch.tensor([1, 0, 1]), torch.tensor([True, True, False])),
                       torch.tensor([True, False, False]))


def test_combine_reads_float_masks_as_keep_masks() -> None:
    allowed = torch.tensor([True, False, True])
    combined = combine_masks(allowed, torch.tensor([1.0, 1.0, 0.0]))
    assert combined.dtype == torch.bool and combined.tolist() == [True, False, False]
    with pytest.raises(TypeError, match="holding 0.5 besides 0 and 1"):
        combine_masks(allowed, torch.tensor([0.5, 0.0, -1.0]))


def test_mask_with_bias_removes_what_the_mask_forbids() -> None:
    combined = mask_with_bias(torch.tensor([True, False, True]), torch.tensor([0.5, 0.0, -1.0]))
    assert combined.tolist() == [0.5, INF, -1.0]
    assert mask_with_bias(None, None) is None


def test_combine_masks_of_nothing_is_none() -> None:
    assert combine_masks() is None
    assert combine_masks(None, None) is None


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((3, 5), (1, 1, 3, 5)), ((2, 3, 5), (2, 1, 3, 5)), ((2, 4, 3, 5), (2, 4, 3, 5)),
     ((1, 1, 1, 5), (1, 1, 1, 5)), ((2, 1, 3, 1), (2, 1, 3, 1))],
)
def test_validate_brings_masks_to_rank_4(shape, expected) -> None:
    mask = torch.ones(shape, dtype=torch.bool)
    out = validate_attention_mask(mask, batch=2, heads=4, query_len=3, key_len=5, dtype=torch.float32)
    assert out.shape == expected


def test_validate_reads_integer_and_float_masks_as_keep_masks() -> None:
    sizes = {"batch": 1, "heads": 1, "query_len": 2, "key_len": 2}
    out = validate_attention_mask(torch.tensor([[1, 0], [2, 0]], dtype=torch.uint8), **sizes)
    assert out.dtype == torch.bool and out[0, 0].tolist() == [[True, False], [True, False]]
    out = validate_attention_mask(torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float16), **sizes)
    assert out.dtype == torch.bool and out[0, 0].tolist() == [[True, False], [True, True]]
    assert validate_attention_mask(None, **sizes) is None


def test_validate_refuses_additive_masks_and_names_attn_bias() -> None:
    sizes = {"batch": 1, "heads": 1, "query_len": 2, "key_len": 2}
    with pytest.raises(TypeError, match=r"holding -inf besides 0 and 1.*pass an additive bias as attn_bias="):
        validate_attention_mask(torch.tensor([[0.0, INF], [0.0, 0.0]]), **sizes)
    with pytest.raises(TypeError, match=r"float mask of zeros only"):
        validate_attention_mask(torch.zeros(2, 2), **sizes)


def test_bias_is_cast_to_the_scores_and_must_be_float() -> None:
    sizes = {"batch": 2, "heads": 1, "query_len": 2, "key_len": 2, "dtype": torch.float32}
    bias = validate_attention_bias(torch.tensor([[0.0, INF], [1.0, 2.0]], dtype=torch.float64), **sizes)
    assert bias.dtype == torch.float32 and bias.shape == (1, 1, 2, 2)
    with pytest.raises(TypeError, match=r"attn_bias is added to the scores and must be a float tensor"):
        validate_attention_bias(torch.ones(2, 2, dtype=torch.bool), **sizes)


def test_rank_2_masks_are_read_by_the_shape_that_fits_and_refused_when_both_do() -> None:
    padding = torch.tensor([[True, True, False], [True, False, False]])  # [B=2, S=3]
    out = validate_attention_mask(padding, batch=2, heads=1, query_len=4, key_len=3)
    assert out.shape == (2, 1, 1, 3) and torch.equal(out[:, 0, 0], padding)
    out = validate_attention_mask(torch.ones(4, 3, dtype=torch.bool), batch=2, heads=1, query_len=4, key_len=3)
    assert out.shape == (1, 1, 4, 3)
    with pytest.raises(ValueError, match=r"ambiguous: batch size and query length are both 2.*attention_mask="):
        validate_attention_mask(padding, batch=2, heads=1, query_len=2, key_len=3)


def test_torch_masks_keep_torch_meaning() -> None:
    blocked = torch.tensor([[False, True], [False, False]])
    keep, bias = from_torch_mask(blocked, name="attn_mask", padding=False)
    assert bias is None and torch.equal(keep, ~blocked)
    keep, bias = from_torch_mask(torch.tensor([[False, True]]), name="src_key_padding_mask", padding=True)
    assert keep.shape == (1, 1, 1, 2) and keep.flatten().tolist() == [True, False]
    keep, bias = from_torch_mask(torch.tensor([[0.0, INF]]), name="attn_mask", padding=False)
    assert keep is None and bias.tolist() == [[0.0, INF]]


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(3, 4, dtype=torch.bool), ValueError,
         r"mask has shape \(1, 1, 3, 4\); expected a shape that broadcasts to \[B, H, T, S\] = \[2, 4, 3, 5\]"),
        (torch.ones(3, 2, 3, 5, dtype=torch.bool), ValueError, r"mask has shape \(3, 2, 3, 5\)"),
        (torch.ones(5, dtype=torch.bool), ValueError, r"mask must have rank 2 .* got rank 1 with shape \(5,\)"),
        (torch.ones(1, 2, 4, 3, 5, dtype=torch.bool), ValueError, r"got rank 5 with shape \(1, 2, 4, 3, 5\)"),
        (torch.full((3, 5), 2.0, dtype=torch.float64), TypeError,
         r"mask is a float mask holding 2.0 besides 0 and 1"),
        (torch.zeros(3, 5, dtype=torch.complex64), TypeError,
         r"mask has unsupported dtype torch.complex64; expected bool, integer or float"),
        ([[True] * 5] * 3, TypeError, r"mask must be a torch.Tensor or None, got list"),
    ],
)
def test_validate_rejects_bad_masks(mask, error, match) -> None:
    with pytest.raises(error, match=match):
        validate_attention_mask(mask, batch=2, heads=4, query_len=3, key_len=5, dtype=torch.float32)


def test_validate_names_the_argument() -> None:
    with pytest.raises(ValueError, match=r"^attn_bias has shape"):
        validate_attention_mask(
            torch.ones(2, 2, dtype=torch.bool), batch=1, heads=1, query_len=3, key_len=3,
            dtype=torch.float32, name="attn_bias",
        )
