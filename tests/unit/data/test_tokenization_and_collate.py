import torch

from attnlab.data import (
    MaskedLMCollator, PaddingCollator, TokenizedDataset, encode_texts, load_tokenizer_file, special_ids,
    train_tokenizer,
)

TEXTS = ["a good film", "a bad film", "the best film of the year", "not good at all"] * 10


def test_trained_tokenizer_wraps_and_truncates(tmp_path):
    for kind in ("wordpiece", "bpe"):
        tokenizer = train_tokenizer(TEXTS, vocab_size=100, kind=kind, min_frequency=1)
        ids = encode_texts(tokenizer, ["a good film", "the best film of the year"], max_length=4)
        assert special_ids(tokenizer)["[PAD]"] == 0
        assert ids[0][0] == tokenizer.token_to_id("[CLS]") and ids[0][-1] == tokenizer.token_to_id("[SEP]")
        assert len(ids[1]) == 4
        assert tokenizer.truncation is None
        tokenizer.save(str(tmp_path / "tokenizer.json"))
        assert load_tokenizer_file(tmp_path / "tokenizer.json").encode("a good film").ids == tokenizer.encode("a good film").ids


def test_dynamic_padding_and_mask():
    data = TokenizedDataset([[2, 5, 3], [2, 3]], [1, 0])
    batch = PaddingCollator(0)([data[0], data[1]])
    assert batch["input_ids"].tolist() == [[2, 5, 3], [2, 3, 0]]
    assert batch["mask"].tolist() == [[True, True, True], [True, True, False]]
    assert batch["labels"].tolist() == [1, 0]


def test_masked_lm_collator_is_deterministic_and_skips_specials():
    data = TokenizedDataset([[2] + list(range(10, 40)) + [3]] * 4)
    collate = MaskedLMCollator(0, 4, 50, [0, 2, 3, 4], probability=0.5, seed=1)
    items = [data[i] for i in range(4)]
    first, second = collate(items), collate(items)
    assert torch.equal(first["input_ids"], second["input_ids"])
    assert (first["labels"][:, 0] == -100).all() and (first["labels"][:, -1] == -100).all()
    assert (first["labels"] != -100).any()
    other = collate([data[i] for i in (1, 0, 2, 3)])
    assert not torch.equal(other["labels"], first["labels"])
