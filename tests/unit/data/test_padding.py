"""One padder and one rule for the padding id."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models
from torch import nn

from attnlab.data import model_pad_id, pad_id_for, pad_token_ids, tokenizer_pad_id


def _tokenizer(vocabulary: list[str]) -> Tokenizer:
    return Tokenizer(models.WordLevel({token: index for index, token in enumerate(vocabulary)}, unk_token=vocabulary[0]))


def test_pad_token_ids_right_pads_and_marks_real_tokens():
    input_ids, mask = pad_token_ids([[5, 6, 7], [8]], pad_id=1)
    assert input_ids.tolist() == [[5, 6, 7], [8, 1, 1]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert pad_token_ids([[5]], 0, length=4)[0].tolist() == [[5, 0, 0, 0]]
    with pytest.raises(ValueError, match="length"):
        pad_token_ids([[5, 6]], 0, length=1)


def test_the_pad_id_rule_tokenizer_then_model_then_default():
    class WithConfig(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Module()
            self.inner.config = type("Config", (), {"pad_id": 3})()

    bert_style = _tokenizer(["[UNK]", "x", "[PAD]"])
    sentencepiece_style = _tokenizer(["<unk>", "<pad>"])
    no_padding = _tokenizer(["[UNK]", "x"])
    assert tokenizer_pad_id(bert_style) == 2 and tokenizer_pad_id(sentencepiece_style) == 1
    assert tokenizer_pad_id(no_padding) is None and tokenizer_pad_id(no_padding, default=0) == 0
    assert model_pad_id(WithConfig()) == 3 and model_pad_id(nn.Linear(1, 1)) is None
    assert pad_id_for(bert_style, WithConfig()) == 2
    assert pad_id_for(no_padding, WithConfig()) == 3
    assert pad_id_for(no_padding, nn.Linear(1, 1)) == 0 and pad_id_for(default=7) == 7


def test_one_masked_mean_for_every_pooling_step():
    from attnlab._masked_mean import masked_mean
    from attnlab.models import pool
    from attnlab.models.sentence import mean_pool

    x = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [6.0]]])  # [B, T, E]
    mask = torch.tensor([[True, True, False], [False, False, False]])
    expected = torch.tensor([[2.0], [0.0]])  # padding left out; a row without real tokens gives zeros
    torch.testing.assert_close(masked_mean(x, mask, keepdim=False), expected)
    torch.testing.assert_close(masked_mean(x, mask), expected[:, None])
    torch.testing.assert_close(pool(x, mask, "mean"), expected)
    torch.testing.assert_close(mean_pool(x, mask), expected)
