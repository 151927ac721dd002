"""Mean pooling and the sentence encoder."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from attnlab import TransformerEncoder
from attnlab.checkpoints.encoders.loading import bert_style_config
from attnlab.models.sentence import SentenceEncoder, mean_pool, pad_encodings


def test_mean_pool_ignores_padding_and_empty_rows_give_zeros():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled, torch.stack([hidden[0, :2].mean(0), torch.zeros(2)]))
    with pytest.raises(ValueError, match=r"mask \[B, T\]"):
        mean_pool(hidden, mask[:, :2])


def _word_tokenizer() -> Tokenizer:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: index + 2 for index, word in enumerate("a b c d e f g".split())}}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    return tokenizer


def test_pad_encodings_right_pads_and_marks_real_tokens():
    encodings = _word_tokenizer().encode_batch(["a b c", "d"])
    input_ids, mask = pad_encodings(encodings, pad_id=0)
    assert input_ids.tolist() == [[2, 3, 4], [5, 0, 0]]
    assert mask.tolist() == [[True, True, True], [True, False, False]]


def test_encode_keeps_order_is_batch_invariant_and_normalised():
    torch.manual_seed(0)
    model = TransformerEncoder.from_config(
        bert_style_config(9, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=16, pad_id=0, dropout=0.0)
    ).train()
    encoder = SentenceEncoder(model, _word_tokenizer(), max_length=4)
    texts = ["a b c", "d", "e f g a b c", "b"]
    together = encoder.encode(texts, batch_size=3)
    alone = torch.cat([encoder.encode([text]) for text in texts])
    assert together.shape == (4, 16)
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)
    torch.testing.assert_close(together.norm(dim=1), torch.ones(4))
    assert model.training, "encode must restore the model's mode"
    with pytest.raises(TypeError, match="not one string"):
        encoder.encode("a b")
