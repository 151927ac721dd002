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


def test_wordpiece_training_is_repeatable():
    # Regression: the WordPiece trainer numbered "##x" continuations in hash order and broke
    # ties between equally frequent merges by those numbers: two trainings on the same texts
    # (same config, same seed) gave different vocabularies and ids (test accuracy 0.594 vs 0.605).
    import subprocess
    import sys

    from attnlab.data import load_rotten_tomatoes

    texts = [text for text, _ in load_rotten_tomatoes().train][:2000]
    sample = "an unbelievably tedious, overlong film ; yet strangely moving"
    trained = [train_tokenizer(texts, vocab_size=2000) for _ in range(3)]
    assert all(tokenizer.get_vocab() == trained[0].get_vocab() for tokenizer in trained)
    assert len({tuple(tokenizer.encode(sample).ids) for tokenizer in trained}) == 1
    # another process hashes with other keys
    script = ("from attnlab.data import load_rotten_tomatoes, train_tokenizer\n"
              "texts = [text for text, _ in load_rotten_tomatoes().train][:2000]\n"
              f"print(train_tokenizer(texts, vocab_size=2000).encode({sample!r}).ids)\n")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(trained[0].encode(sample).ids)
    # still a WordPiece tokenizer whose only added tokens are the five special ones
    tokenizer = trained[0]
    assert sorted(token.content for token in tokenizer.get_added_tokens_decoder().values()) == sorted(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    assert tokenizer.token_to_id("[PAD]") == 0 and tokenizer.get_vocab_size() == 2000
    assert any(token.startswith("##") for token in tokenizer.encode(sample).tokens)
    assert tokenizer.decode(tokenizer.encode(sample).ids) == "an unbelievably tedious, overlong film ; yet strangely moving"
