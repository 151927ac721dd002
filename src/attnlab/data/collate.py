"""Tokenized data sets and batch collation with dynamic padding.

A batch is a dict ``{"input_ids": [B, T], "mask": [B, T], "labels": ...}`` where
``T`` is the longest sequence of the batch and ``mask`` is ``True`` on real tokens
(padding mask convention: ``True`` = may attend). ``model(**batch)`` works for the
models in :mod:`attnlab.models`.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from .padding import pad_token_ids

__all__ = ["TokenizedDataset", "PaddingCollator", "MaskedLMCollator", "mask_tokens"]


class TokenizedDataset(Dataset):
    """Token-id lists with optional integer labels; items are dicts with their index."""

    def __init__(self, input_ids: Sequence[Sequence[int]], labels: Sequence[int] | None = None) -> None:
        if labels is not None and len(labels) != len(input_ids):
            raise ValueError(f"labels ({len(labels)}) and input_ids ({len(input_ids)}) differ in length")
        self.input_ids = [list(ids) for ids in input_ids]
        self.labels = None if labels is None else [int(label) for label in labels]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        item = {"index": index, "input_ids": self.input_ids[index]}
        if self.labels is not None:
            item["label"] = self.labels[index]
        return item


def _pad(items: Sequence[dict], pad_id: int) -> tuple[Tensor, Tensor]:
    return pad_token_ids([item["input_ids"] for item in items], pad_id)  # [B, T] each


class PaddingCollator:
    """Pad a list of :class:`TokenizedDataset` items to the longest one; labels as ``[B]``."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, items: Sequence[dict]) -> dict[str, Tensor]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        input_ids, mask = _pad(items, self.pad_id)
        batch = {"input_ids": input_ids, "mask": mask}
        if "label" in items[0]:
            batch["labels"] = torch.tensor([item["label"] for item in items], dtype=torch.long)
        return batch


def mask_tokens(
    input_ids: Tensor,
    maskable: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masking: pick ``probability`` of the maskable tokens; of those, 80 % become
    ``mask_id``, 10 % a random token, 10 % stay. Labels are -100 where nothing is predicted.

    Shape:
        ``input_ids``, ``maskable`` (bool, ``True`` where a token may be picked): ``[B, T]``
        -> ``(masked_ids [B, T], labels [B, T])``.
    """
    picked = (torch.rand(input_ids.shape, generator=generator) < probability) & maskable
    labels = torch.where(picked, input_ids, torch.full_like(input_ids, -100))
    roll = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(0, vocab_size, input_ids.shape, generator=generator)
    masked = torch.where(picked & (roll < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(picked & (roll >= 0.8) & (roll < 0.9), random_ids, masked)
    return masked, labels


class MaskedLMCollator:
    """Pad and mask tokens for masked-LM training.

    The masking is a pure function of ``seed`` and the items' dataset indices, so the
    same batch is masked the same way after a resume or on any process.
    """

    def __init__(
        self, pad_id: int, mask_id: int, vocab_size: int, special_ids: Sequence[int], *, probability: float = 0.15, seed: int = 0
    ) -> None:
        self.pad_id, self.mask_id, self.vocab_size = pad_id, mask_id, vocab_size
        self.special_ids = torch.tensor(sorted(set(special_ids)), dtype=torch.long)
        self.probability, self.seed = probability, seed

    def __call__(self, items: Sequence[dict]) -> dict[str, Tensor]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        input_ids, mask = _pad(items, self.pad_id)
        indices = torch.tensor([item["index"] for item in items], dtype=torch.int64)
        generator = torch.Generator().manual_seed(zlib.crc32(indices.numpy().tobytes()) + self.seed * 2**32)
        maskable = mask & ~torch.isin(input_ids, self.special_ids)
        masked, labels = mask_tokens(
            input_ids, maskable, mask_id=self.mask_id, vocab_size=self.vocab_size,
            probability=self.probability, generator=generator,
        )
        return {"input_ids": masked, "mask": mask, "labels": labels}
