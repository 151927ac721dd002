"""Texts for ``attnlab analyze``: where they come from and how they become batches.

Dimension letters: ``B`` batch, ``T`` length.

``--data`` is a ``.txt`` file (one text a line), a ``.csv`` file (column ``text`` or the
one named, labels from ``label`` when present), a ``.jsonl`` file (``{"text": ...,
"label": ...}`` a line) or ``rotten_tomatoes``, the embedded data set (all splits in
order, or the one named).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import torch

__all__ = ["load_texts", "encode_batches"]

TEXT_COLUMNS = ("text", "sentence", "review", "content")


def _label(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def load_texts(
    spec: str, *, split: Optional[str] = None, text_column: Optional[str] = None, limit: Optional[int] = None
) -> list[tuple[str, Optional[int]]]:
    """``[(text, label or None), ...]`` from a file or the embedded data set.

    Args:
        spec: a path or ``"rotten_tomatoes"``.
        split: for the embedded data: ``train``, ``validation`` or ``test`` (default all).
        text_column: CSV column holding the text.
        limit: keep the first ``limit`` texts.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if spec == "rotten_tomatoes":
        try:
            from ..data.rotten_tomatoes import load_rotten_tomatoes  # type: ignore[import-not-found]
        except ImportError as error:
            raise ValueError(
                f"the embedded data set is not available in this installation ({error})"
            ) from error
        splits = load_rotten_tomatoes()
        names = [split] if split else ["train", "validation", "test"]
        rows: list[tuple[str, Optional[int]]] = []
        for name in names:
            try:
                examples = splits[name]
            except KeyError as error:
                raise ValueError(f"split must be train, validation or test, got {name!r}") from error
            rows.extend((text, _label(label)) for text, label in examples)
        return rows[:limit]
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"--data {spec!r} is neither a file nor 'rotten_tomatoes'")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns = reader.fieldnames or []
            column = text_column or next(
                (name for name in TEXT_COLUMNS if name in columns), columns[0] if columns else None
            )
            if column not in columns:
                raise ValueError(f"text column {column!r} not in {path} (columns: {columns})")
            rows = [(row[column], _label(row.get("label"))) for row in reader if row.get(column)]
    elif suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                record = json.loads(line)
                if not isinstance(record, dict) or "text" not in record:
                    raise ValueError(f"{path}:{number}: expected an object with a 'text' field")
                rows.append((str(record["text"]), _label(record.get("label"))))
    else:
        rows = [(line, None) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no text")
    return rows[:limit]


def _real_ids(encoding: Any) -> list[int]:
    """The ids of real tokens, dropping any padding a tokenizer with padding switched on added."""
    return [token_id for token_id, keep in zip(encoding.ids, encoding.attention_mask) if keep]


def _padded_length(length: int, multiple: int, max_length: int) -> int:
    """``length`` rounded up to a multiple, but never past ``max_length`` (nor below ``length``)."""
    rounded = -(-max(1, length) // multiple) * multiple
    return max(max(1, length), min(rounded, max_length))


def _padded(part: list[tuple[list[int], Optional[int]]], pad_id: int, T: int) -> dict[str, torch.Tensor]:
    input_ids = torch.full((len(part), T), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(part), T, dtype=torch.bool)  # [B, T]
    for row, (ids, _) in enumerate(part):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[row, : len(ids)] = True
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
