"""The digits–statements task: real images, balanced labels, split by image, deterministic."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from attnlab.data.digits_text import (
    DIGIT_WORDS,
    VOCABULARY,
    collate_digits_text,
    digit_statements,
    digits_text_tokenizer,
    load_digits_text,
)


@pytest.fixture(scope="module")
def splits():
    return load_digits_text(seed=0, statements_per_image=4)


def test_every_image_is_used_once_and_splits_share_no_image(splits):
    ids = {name: {example.image_id for example in examples} for name, examples in splits.items()}
    assert not ids["train"] & ids["test"]
    assert not ids["train"] & ids["validation"]
    assert not ids["validation"] & ids["test"]
    assert len(ids["train"] | ids["validation"] | ids["test"]) == 1797


def test_labels_are_balanced_overall_and_per_image(splits):
    for examples in splits.values():
        assert collections.Counter(example.label for example in examples)[1] * 2 == len(examples)
    per_image = collections.defaultdict(int)
    for example in splits["test"]:
        per_image[example.image_id] += example.label
    assert set(per_image.values()) == {2}


def test_labels_are_the_truth_of_the_statement(splits):
    for example in splits["train"][:400]:
        family = digit_statements(example.digit)
        truths = {text: truth for groups in family.values() for truth, items in groups.items()
                  for text, _ in items}
        assert truths[example.text] == bool(example.label)


def test_statements_say_what_they_should():
    statements = digit_statements(7)
    assert ("this is a seven", 7) in statements["identity"][True]
    assert ("this is not a three", 3) in statements["negation"][True]
    assert ("a number greater than four", 4) in statements["greater"][True]
    assert ("the digit is even", -1) in statements["parity"][False]
    assert ("this is an eight", 8) in statements["identity"][False]
    assert ("the digit is less than seven", 7) in statements["less"][False]


def test_images_are_real_digits_scaled_to_unit_range(splits):
    images = np.stack([example.image for example in splits["validation"]])
    assert images.shape[1:] == (8, 8) and images.dtype == np.float32
    assert images.min() == 0.0 and images.max() == 1.0


def test_same_seed_same_examples_other_seed_other_split():
    first, second = load_digits_text(seed=3, statements_per_image=2), load_digits_text(seed=3, statements_per_image=2)
    assert [(e.image_id, e.text, e.label) for e in first["test"]] == [
        (e.image_id, e.text, e.label) for e in second["test"]
    ]
    other = load_digits_text(seed=4, statements_per_image=2)
    assert {e.image_id for e in other["test"]} != {e.image_id for e in first["test"]}


def test_tokenizer_covers_every_statement_and_starts_with_cls(splits):
    tokenizer = digits_text_tokenizer()
    unk = tokenizer.token_to_id("[UNK]")
    for example in splits["validation"]:
        assert unk not in tokenizer.encode(example.text).ids
    assert tokenizer.encode("this is a seven").tokens == ["[CLS]", "this", "is", "a", "seven"]
    assert tokenizer.get_vocab_size() == len(VOCABULARY) and set(DIGIT_WORDS) <= set(VOCABULARY)


def test_collate_pads_with_zero_and_marks_real_tokens(splits):
    batch = collate_digits_text(splits["test"][:5], digits_text_tokenizer())
    assert batch["images"].shape == (5, 8, 8)
    assert batch["labels"].tolist() == [e.label for e in splits["test"][:5]]
    assert (batch["mask"] == (batch["input_ids"] != 0)).all()
    assert batch["mask"][:, 0].all()


@pytest.mark.parametrize("kwargs", [{"statements_per_image": 3}, {"fractions": (0.5, 0.5, 0.5)}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        load_digits_text(**kwargs)


def test_collate_can_share_each_image_between_its_statements(splits):
    examples = splits["test"][:8]  # two images, four statements each
    batch = collate_digits_text(examples, digits_text_tokenizer(), share_images=True)
    assert batch["images"].shape == (2, 8, 8)
    assert batch["image_index"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    np.testing.assert_array_equal(batch["images"][1].numpy(), examples[4].image)
