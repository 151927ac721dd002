"""Texts into padded batches for analysis, lazily and within a memory budget.

Dimension letters: ``B`` batch, ``T`` length.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import torch

from .padding import pad_token_ids

__all__ = ["encode_batches"]


def _real_ids(encoding: Any) -> list[int]:
    """The ids of real tokens, dropping any padding a tokenizer with padding switched on added."""
    return [token_id for token_id, keep in zip(encoding.ids, encoding.attention_mask) if keep]


def _padded_length(length: int, multiple: int, max_length: int) -> int:
    """``length`` rounded up to a multiple, but never past ``max_length`` (nor below ``length``)."""
    rounded = -(-max(1, length) // multiple) * multiple
    return max(max(1, length), min(rounded, max_length))


def _padded(part: list[tuple[list[int], Optional[int]]], pad_id: int, T: int) -> dict[str, torch.Tensor]:
    input_ids, mask = pad_token_ids([ids for ids, _ in part], pad_id, T)  # [B, T] each
    batch = {"input_ids": input_ids, "mask": mask}
    labels = [label for _, label in part]
    if all(label is not None for label in labels):
        batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return batch


def encode_batches(
    rows: Iterable[tuple[str, Optional[int]]],
    tokenizer: Any,
    *,
    batch_size: int = 32,
    max_length: int = 128,
    pad_id: int = 0,
    max_attention_cells: Optional[int] = None,
    pad_to_multiple: int = 16,
    sort_window: int = 32,
) -> Iterator[dict[str, torch.Tensor]]:
    """Tokenize lazily and yield padded batches ``{"input_ids", "mask", ["labels"]}``.

    Texts are read ``batch_size * sort_window`` at a time and sorted by length inside
    that window, so batches carry little padding while memory stays bounded. With
    ``max_attention_cells``, a batch of long texts holds fewer of them: ``B * T * T``
    stays within the budget (at least one text a batch), so the attention maps of the
    longest batch, and with them the peak memory, do not depend on how long the
    longest text of the data happens to be. Lengths are padded up to a multiple of
    ``pad_to_multiple`` (at most ``max_length``): a handful of distinct batch shapes keeps
    torch's per-shape caches, and memory with them, from growing with the data.

    Shape:
        ``input_ids`` ``[B, T]`` long, ``mask`` ``[B, T]`` bool (``True`` on real
        tokens), ``labels`` ``[B]`` when every text in the batch has a label.
    """
    if batch_size < 1 or max_length < 1:
        raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
    if pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
    if max_attention_cells is not None and max_attention_cells < 1:
        raise ValueError(f"max_attention_cells must be >= 1, got {max_attention_cells}")
    window: list[tuple[str, Optional[int]]] = []

    def flush(chunk: list[tuple[str, Optional[int]]]) -> Iterator[dict[str, torch.Tensor]]:
        encodings = tokenizer.encode_batch([text for text, _ in chunk])
        items = sorted(
            ((_real_ids(encoding)[:max_length], label) for encoding, (_, label) in zip(encodings, chunk)),
            key=lambda item: len(item[0]),
        )
        part: list[tuple[list[int], Optional[int]]] = []
        length = 1
        for item in items:  # ascending length: the newest item sets the batch's T
            T = _padded_length(len(item[0]), pad_to_multiple, max_length)
            full = len(part) == batch_size or (
                max_attention_cells is not None and part and (len(part) + 1) * T * T > max_attention_cells
            )
            if full:
                yield _padded(part, pad_id, length)
                part = []
            part.append(item)
            length = T
        if part:
            yield _padded(part, pad_id, length)

    for row in rows:
        window.append(row)
        if len(window) == batch_size * sort_window:
            yield from flush(window)
            window = []
    if window:
        yield from flush(window)
