"""Bad input to the encoder and its layer raises ValueError/TypeError that names the
argument, what came in and what was expected."""

from __future__ import annotations

import pytest
import torch

from attnlab import TransformerEncoder, TransformerEncoderLayer


@pytest.fixture
def model() -> TransformerEncoder:
    return TransformerEncoder(20, d_model=8, num_layers=2, num_heads=2, d_ff=16, max_len=6, pad_id=0).eval()


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (torch.tensor([[1, -1, 2]]), ValueError, r"input_ids must lie in \[0, vocab_size=20\), got values from -1 to 2"),
        (torch.tensor([[1, 20, 2]]), ValueError, r"input_ids must lie in \[0, vocab_size=20\), got values from 1 to 20"),
        (torch.tensor([1, 2, 3]), ValueError, r"input_ids must be \[B, T\], got shape \(3,\)"),
        (torch.ones(1, 2, 3, dtype=torch.long), ValueError, r"input_ids must be \[B, T\], got shape \(1, 2, 3\)"),
        (torch.ones(1, 3), TypeError, r"input_ids must be an integer tensor, got dtype torch.float32"),
        ([[1, 2, 3]], TypeError, r"input_ids must be a torch.Tensor, got list"),
        (torch.ones(1, 7, dtype=torch.long), ValueError, r"input length 7 exceeds max_len=6"),
    ],
)
def test_bad_input_ids(model, ids, error, match) -> None:
    with pytest.raises(error, match=match):
        model(ids)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_longer_than_max_len_for_each_absolute_position(position: str) -> None:
    model = TransformerEncoder(20, d_model=8, num_layers=1, num_heads=2, d_ff=16, max_len=4, position=position)
    with pytest.raises(ValueError, match=r"input length 5 exceeds max_len=4"):
        model(torch.ones(2, 5, dtype=torch.long))


@pytest.mark.parametrize(
    ("mask", "error", "match"),
    [
        (torch.ones(2, 4, dtype=torch.bool), ValueError,
         r"a 2-D mask is a padding mask and must be \[B, T\] = \[2, 3\], got \(2, 4\)"),
        ([[True] * 3] * 2, TypeError, r"mask must be a torch.Tensor or None, got list"),
        (torch.ones(2, 3, 4, dtype=torch.bool), ValueError, r"mask has shape \(2, 1, 3, 4\)"),
        (torch.zeros(2, 1, 3, 3, dtype=torch.complex64), TypeError, r"mask has unsupported dtype torch.complex64"),
        (torch.zeros(2, 3, dtype=torch.float64).masked_fill(torch.eye(2, 3, dtype=torch.bool), float("-inf")),
         TypeError, r"mask is a float mask holding -inf besides 0 and 1; .*convert it to a bool mask"),
    ],
)
def test_bad_masks(model, mask, error, match) -> None:
    with pytest.raises(error, match=match):
        model(torch.ones(2, 3, dtype=torch.long), mask)


def test_bad_head_mask(model) -> None:
    with pytest.raises(ValueError, match=r"head_mask must be \[H\]=\[2\] or \[L, H\]=\[2, 2\], got \(3,\)"):
        model(torch.ones(1, 3, dtype=torch.long), head_mask=torch.ones(3))


def test_bad_token_type_ids(model) -> None:
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"token_type_ids given, but the encoder has type_vocab_size=0"):
        model(ids, token_type_ids=torch.zeros_like(ids))
    typed = TransformerEncoder(20, d_model=8, num_layers=1, num_heads=2, d_ff=16, type_vocab_size=2)
    with pytest.raises(ValueError, match=r"token_type_ids must match input_ids \(1, 3\), got \(1, 2\)"):
        typed(ids, token_type_ids=torch.zeros(1, 2, dtype=torch.long))


def test_bad_layer_arguments() -> None:
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        TransformerEncoderLayer(10, 4, 16)
    with pytest.raises(ValueError, match=r"d_ff must be a positive int, got 0"):
        TransformerEncoderLayer(8, 2, 0)
    with pytest.raises(ValueError, match=r"dropout must be a float in \[0, 1\), got 1.5"):
        TransformerEncoderLayer(8, 2, 16, dropout=1.5)
    layer = TransformerEncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"query must be \[B, length, 8\], got shape \(2, 3, 6\)"):
        layer(torch.randn(2, 3, 6))


def test_a_mask_that_calls_pad_ids_real_tokens_is_warned_about():
    # Regression: attention_mask=ones over padded ids was taken silently; the padding was attended to.
    import warnings

    torch.manual_seed(0)
    encoder = TransformerEncoder(30, 16, 1, 2, 32, pad_id=0).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    with pytest.warns(UserWarning, match=r"attention_mask marks 2 position\(s\) holding pad_id=0 as real tokens"):
        given = encoder(ids, attention_mask=torch.ones(2, 5)).last_hidden_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        derived = encoder(ids).last_hidden_state  # from pad_id
        agreeing = encoder(ids, attention_mask=ids != 0).last_hidden_state
        encoder(ids, mask=torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]))  # hiding real tokens is a choice
    assert torch.equal(derived, agreeing)
    assert not torch.allclose(given[0, :3], derived[0, :3])  # the mask was used as given
