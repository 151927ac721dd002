"""Digits and statements: a small, real, offline image–text task.

Each example pairs one of scikit-learn's bundled handwritten digits (1,797 real 8×8
images, no download) with a short English statement about it ("this is a seven",
"the digit is even", "a number greater than four", "this is not a three", ...) and a
label: 1 when the statement is true of the image, 0 when it is false.

* Balanced: every image gets as many true as false statements.
* Split by image: the images of ``test`` (and ``validation``) never appear in ``train``.
* Seeded and deterministic: the same arguments give the same examples.

For every image and slot the truth is fixed first (alternating), then a statement
family that has a statement of that truth for the image's digit (identity, negation,
greater, less, parity), then a statement of it. Identity, negation and parity
statements are therefore about as often true as false whatever their wording; the
extreme comparisons ("greater than eight") lean to one side, as they do in language.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from .padding import pad_token_ids, tokenizer_pad_id

if TYPE_CHECKING:
    import torch

__all__ = [
    "DigitsTextExample",
    "load_digits_text",
    "digit_statements",
    "digits_text_tokenizer",
    "collate_digits_text",
    "DIGIT_WORDS",
    "VOCABULARY",
    "PAD_TOKEN",
    "CLS_TOKEN",
    "UNK_TOKEN",
]

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
PAD_TOKEN, UNK_TOKEN, CLS_TOKEN = "[PAD]", "[UNK]", "[CLS]"
_WORDS = (
    "this", "is", "a", "an", "not", "the", "digit", "image", "shows", "even", "odd",
    "number", "greater", "less", "than",
)
VOCABULARY: tuple[str, ...] = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN) + _WORDS + DIGIT_WORDS
SPLITS = ("train", "validation", "test")


class DigitsTextExample(NamedTuple):
    """One image–statement pair.

    Attributes:
        image: ``[8, 8]`` float32 in ``[0, 1]`` (ink is high).
        text: the statement, lower case.
        label: 1 if the statement is true of the image, else 0.
        digit: the image's digit, 0–9.
        image_id: index of the image in ``sklearn.datasets.load_digits``.
        subject: the digit the statement names (``"this is a seven"`` -> 7), or -1 for
            statements that name none (even/odd).
    """

    image: np.ndarray
    text: str
    label: int
    digit: int
    image_id: int
    subject: int


def _article(word: str) -> str:
    return "an" if word in ("eight", "even", "odd") else "a"


def digit_statements(digit: int) -> dict[str, dict[bool, list[tuple[str, int]]]]:
    """Every statement this task uses, grouped by family and truth, for one ``digit``.

    Returns:
        ``{family: {True: [(text, subject), ...], False: [...]}}``; ``subject`` is the
        digit the statement names, or -1.
    """
    if not 0 <= digit <= 9:
        raise ValueError(f"digit must lie in 0..9, got {digit}")
    families: dict[str, dict[bool, list[tuple[str, int]]]] = {}

    def add(family: str, truth: bool, text: str, subject: int) -> None:
        families.setdefault(family, {True: [], False: []})[truth].append((text, subject))

    for other, word in enumerate(DIGIT_WORDS):
        named = f"{_article(word)} {word}"
        for template in ("this is {}", "the digit is {}", "the image shows {}"):
            add("identity", other == digit, template.format(named), other)
        for template in ("this is not {}", "the digit is not {}"):
            add("negation", other != digit, template.format(named), other)
        if other < 9:
            for template in ("a number greater than {}", "the digit is greater than {}"):
                add("greater", digit > other, template.format(word), other)
        if other > 0:
            for template in ("a number less than {}", "the digit is less than {}"):
                add("less", digit < other, template.format(word), other)
    for parity in ("even", "odd"):
        truth = (digit % 2 == 0) == (parity == "even")
        for text in (f"the digit is {parity}", f"this is {_article(parity)} {parity} number"):
            add("parity", truth, text, -1)
    return families


def _load_images() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the digits task needs scikit-learn: pip install 'attnlab[digits]'"
        ) from error
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)  # [N, 8, 8], ink in [0, 1]
    return images, digits.target.astype(np.int64)


def _split_images(count: int, fractions: Sequence[float], seed: int) -> dict[str, list[int]]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    n_train = round(fractions[0] * count)
    n_validation = round(fractions[1] * count)
    return {
        "train": sorted(order[:n_train]),
        "validation": sorted(order[n_train : n_train + n_validation]),
        "test": sorted(order[n_train + n_validation :]),
    }


def load_digits_text(
    *,
    seed: int = 0,
    statements_per_image: int = 8,
    fractions: Sequence[float] = (0.7, 0.1, 0.2),
) -> dict[str, list[DigitsTextExample]]:
    """The digits–statements task, split by image.

    Args:
        seed: seeds the image split and the statement draw.
        statements_per_image: statements per image; even, half of them true.
        fractions: shares of the images in ``train``, ``validation`` and ``test``.

    Returns:
        ``{"train": [...], "validation": [...], "test": [...]}`` of
        :class:`DigitsTextExample`, ordered by image then statement.
    """
    if not isinstance(statements_per_image, int) or statements_per_image <= 0 or statements_per_image % 2:
        raise ValueError(f"statements_per_image must be a positive even int, got {statements_per_image!r}")
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"fractions must be three shares >= 0 summing to 1, got {tuple(fractions)}")
    images, targets = _load_images()
    split_ids = _split_images(len(images), fractions, seed)
    statements = [digit_statements(digit) for digit in range(10)]
    splits: dict[str, list[DigitsTextExample]] = {}
    for name in SPLITS:
        rng = random.Random(f"{seed}-{name}")
        examples = []
        for image_id in split_ids[name]:
            digit = int(targets[image_id])
            families = statements[digit]
            for slot in range(statements_per_image):
                truth = slot % 2 == 0
                choices = [family for family in sorted(families) if families[family][truth]]
                text, subject = rng.choice(families[rng.choice(choices)][truth])
                examples.append(DigitsTextExample(images[image_id], text, int(truth), digit, image_id, subject))
        splits[name] = examples
    return splits


def digits_text_tokenizer():
    """A word-level :class:`tokenizers.Tokenizer` for the statements, with ``[CLS]`` first.

    Padding and truncation are off; id 0 is ``[PAD]``.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {token: index for index, token in enumerate(VOCABULARY)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS_TOKEN} $A", special_tokens=[(CLS_TOKEN, vocab[CLS_TOKEN])]
    )
    return tokenizer


def collate_digits_text(
    examples: Sequence[DigitsTextExample], tokenizer, *, share_images: bool = False
) -> dict[str, "torch.Tensor"]:
    """Batch examples into tensors for :class:`~attnlab.models.image_text.ImageTextModel`.

    Args:
        examples: the pairs to batch.
        tokenizer: from :func:`digits_text_tokenizer`.
        share_images: keep each distinct image once and add ``image_index`` (the image
            row of every statement), so the model encodes each image once.

    Returns:
        ``input_ids [B, T]`` (padded with id 0), ``mask [B, T]`` (``True`` on real
        tokens), ``images [B or N, 8, 8]``, ``labels [B]`` and, with ``share_images``,
        ``image_index [B]``.
    """
    import torch

    encodings = tokenizer.encode_batch([example.text for example in examples])
    pad_id = tokenizer_pad_id(tokenizer, default=0)
    input_ids, mask = pad_token_ids([encoding.ids for encoding in encodings], pad_id)
    batch = {"input_ids": input_ids, "mask": mask}
    if share_images:
        rows: dict[int, int] = {}
        for example in examples:
            rows.setdefault(example.image_id, len(rows))
        unique = {image_id: None for image_id in rows}
        for example in examples:
            unique[example.image_id] = example.image
        batch["images"] = torch.from_numpy(np.stack(list(unique.values())))
        batch["image_index"] = torch.tensor([rows[example.image_id] for example in examples])
    else:
        batch["images"] = torch.from_numpy(np.stack([example.image for example in examples]))
    batch["labels"] = torch.tensor([example.label for example in examples])
    return batch
