"""Bad input to the attention kernel and modules raises ValueError/TypeError that
names the argument, what came in and what was expected."""

from __future__ import annotations

import pytest
import torch

from attnlab import MultiHeadAttention, ScaledDotProductAttention
from attnlab.attention import attention

E, HEADS = 16, 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"d_model": 10, "num_heads": 3}, r"d_model=10 is not divisible by num_heads=3"),
        ({"d_model": 0, "num_heads": 1}, r"d_model must be a positive int, got 0"),
        ({"d_model": 16, "num_heads": 0}, r"num_heads must be a positive int, got 0"),
        ({"d_model": 16, "num_heads": 2.0}, r"num_heads must be a positive int, got 2.0"),
        ({"d_model": 16, "num_heads": 4, "dropout": 1.0}, r"dropout must be a float in \[0, 1\), got 1.0"),
    ],
)
def test_bad_constructor_arguments(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


def test_bad_dropout_for_scaled_dot_product_attention() -> None:
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\), got -0.1"):
        ScaledDotProductAttention(-0.1)


@pytest.fixture
def mha() -> MultiHeadAttention:
    return MultiHeadAttention(E, HEADS, kdim=6, vdim=10).eval()


def _inputs(T=3, S=5, batch=2, kdim=6, vdim=10):
    return torch.randn(batch, T, E), torch.randn(batch, S, kdim), torch.randn(batch, S, vdim)


@pytest.mark.parametrize(
    ("which", "tensor", "match"),
    [
        ("query", torch.randn(3, E), r"query must be \[B, length, 16\], got shape \(3, 16\)"),
        ("query", torch.randn(2, 3, 8), r"query must be \[B, length, 16\], got shape \(2, 3, 8\)"),
        ("key", torch.randn(2, 5, E), r"key must be \[B, length, 6\], got shape \(2, 5, 16\)"),
        ("key", torch.randn(1, 2, 5, 6), r"key must be \[B, length, 6\], got shape \(1, 2, 5, 6\)"),
        ("value", torch.randn(2, 5, 6), r"value must be \[B, length, 10\], got shape \(2, 5, 6\)"),
        ("value", torch.randn(2, 4, 10), r"key and value must share \[B, S\]; got key \(2, 5, 6\), value \(2, 4, 10\)"),
        ("key_value_batch", None, r"query and key must share the batch size; got 2 and 3"),
    ],
)
def test_bad_qkv_shapes(mha, which, tensor, match) -> None:
    query, key, value = _inputs()
    if which == "query":
        query = tensor
    elif which == "key":
        key = tensor
    elif which == "value":
        value = tensor
    else:
        _, key, value = _inputs(batch=3)
    with pytest.raises(ValueError, match=match):
        mha(query, key, value)


def test_non_tensor_query(mha) -> None:
    _, key, value = _inputs()
    with pytest.raises(TypeError, match=r"query must be a torch.Tensor, got list"):
        mha([[0.0] * E], key, value)


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(3, 4, dtype=torch.bool), ValueError, r"mask has shape \(1, 1, 3, 4\); expected .*\[2, 4, 3, 5\]"),
        (torch.ones(2, 3, 3, 5, dtype=torch.bool), ValueError, r"mask has shape \(2, 3, 3, 5\)"),
        (torch.ones(5, dtype=torch.bool), ValueError, r"mask must have rank 2 \[T, S\] or \[B, S\], 3 \[B, T, S\] or 4"),
        (torch.zeros(3, 5, dtype=torch.complex64), TypeError, r"mask has unsupported dtype torch.complex64"),
        (torch.zeros(3, 5).masked_fill(torch.eye(3, 5, dtype=torch.bool), float("-inf")), TypeError,
         r"mask is a float mask holding -inf besides 0 and 1; .*pass an additive bias as attn_bias="),
        (torch.zeros(3, 5, dtype=torch.float16), TypeError, r"mask is a float mask of zeros only"),
    ],
)
@pytest.mark.parametrize("with_padding", [False, True])
def test_bad_masks(mha, mask, error, match, with_padding) -> None:
    kwargs = {"attention_mask": torch.ones(2, 5, dtype=torch.bool)} if with_padding else {}
    with pytest.raises(error, match=match):
        mha(*_inputs(), mask, **kwargs)


@pytest.mark.parametrize(
    ("attention_mask", "error", "match"),
    [
        (torch.ones(2, 4, dtype=torch.bool), ValueError,
         r"attention_mask must be \[B, S\] = \[2, 5\] with True/1 on real keys, got \(2, 4\)"),
        ([[True] * 5] * 2, TypeError, r"attention_mask must be a torch.Tensor or None, got list"),
        (torch.full((2, 5), 0.5), TypeError, r"attention_mask is a float mask holding 0.5 besides 0 and 1"),
    ],
)
def test_bad_attention_mask(mha, attention_mask, error, match) -> None:
    with pytest.raises(error, match=match):
        mha(*_inputs(), attention_mask=attention_mask)


def test_key_padding_mask_is_refused_with_the_way_out(mha) -> None:
    with pytest.raises(TypeError, match=r"key_padding_mask is not taken: torch.nn marks padding with True.*"
                                        r"attention_mask=\[B, S\]"):
        mha(*_inputs(), key_padding_mask=torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize(
    ("shapes", "dtypes", "error", "match"),
    [
        (((2, 3, 4), (2, 1, 5, 4), (2, 1, 5, 4)), None, ValueError,
         r"query must be 4-D \[B, H, length, head_dim\], got shape \(2, 3, 4\)"),
        (((1, 2, 3, 4), (1, 2, 5, 8), (1, 2, 5, 4)), None, ValueError,
         r"query head_dim 4 must equal key head_dim 8"),
        (((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 6, 4)), None, ValueError,
         r"key and value must agree in \[B, H, S\]; got key \(1, 2, 5, 4\), value \(1, 2, 6, 4\)"),
        (((1, 2, 3, 4), (1, 3, 5, 4), (1, 3, 5, 4)), None, ValueError,
         r"query and key must agree in \[B, H\]; got query \(1, 2, 3, 4\), key \(1, 3, 5, 4\)"),
        (((1, 2, 3, 4),) * 3, (torch.float32, torch.float64, torch.float32), TypeError,
         r"query, key and value must share one floating dtype, got torch.float32, torch.float64, torch.float32"),
        (((1, 2, 3, 4),) * 3, (torch.int64,) * 3, TypeError, r"share one floating dtype, got torch.int64"),
    ],
)
def test_attention_function_bad_inputs(shapes, dtypes, error, match) -> None:
    dtypes = dtypes or (torch.float32,) * 3
    q, k, v = (torch.ones(shape, dtype=dtype) for shape, dtype in zip(shapes, dtypes))
    with pytest.raises(error, match=match):
        attention(q, k, v)


def test_attention_function_bad_dropout() -> None:
    q = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.5"):
        attention(q, q, q, dropout_p=1.5)
