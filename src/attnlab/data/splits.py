"""Labelled text examples and a fixed, seeded train/validation/test split."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Example", "DatasetSplits", "split_examples"]

Example = tuple[str, int]  # (text, label id)


@dataclass(frozen=True)
class DatasetSplits:
    """Three disjoint lists of ``(text, label_id)`` and the names of the label ids.

    The test split is for the final report only, never for model selection.
    ``splits["train"]`` works as well as ``splits.train``.
    """

    train: list[Example]
    validation: list[Example]
    test: list[Example]
    label_names: tuple[str, ...]

    def __getitem__(self, name: str) -> list[Example]:
        if name not in ("train", "validation", "test"):
            raise KeyError(f"split must be 'train', 'validation' or 'test', got {name!r}")
        return getattr(self, name)

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}


def split_examples(
    examples: Sequence[Example],
    label_names: Sequence[str],
    *,
    seed: int = 0,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> DatasetSplits:
    """Shuffle ``examples`` with ``seed`` and cut them into train/validation/test.

    The same examples, seed and fractions always give the same split (Python's
    ``random.Random`` is stable across platforms and versions).
    """
    for name, value in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
    if validation_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"validation_fraction + test_fraction must be < 1, got {validation_fraction} + {test_fraction}"
        )
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n = len(order)
    n_test = round(n * test_fraction)
    n_validation = round(n * validation_fraction)
    n_train = n - n_test - n_validation
    if n_train <= 0:
        raise ValueError(f"{n} examples leave no training examples after the split")
    pick = lambda indices: [examples[i] for i in indices]  # noqa: E731
    return DatasetSplits(
        train=pick(order[:n_train]),
        validation=pick(order[n_train : n_train + n_validation]),
        test=pick(order[n_train + n_validation :]),
        label_names=tuple(label_names),
    )
