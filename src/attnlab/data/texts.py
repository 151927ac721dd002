"""Texts to look inside: a file or the embedded data set, as ``(text, label id or None)``.

``attnlab analyze --data`` takes a ``.txt`` file (one text a line), a ``.csv`` file
(column ``text`` or the one named, labels from ``label`` when present), a ``.jsonl``
file (``{"text": ..., "label": ...}`` a line), all read by
:func:`attnlab.data.text_files.read_texts`, or ``rotten_tomatoes``, the embedded data
set (all splits in order, or the one named).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .rotten_tomatoes import load_rotten_tomatoes
from .text_files import read_texts

__all__ = ["EMBEDDED", "load_texts"]

EMBEDDED = "rotten_tomatoes"


def _label(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def load_texts(
    spec: str, *, split: Optional[str] = None, text_column: Optional[str] = None, limit: Optional[int] = None
) -> list[tuple[str, Optional[int]]]:
    """``[(text, label or None), ...]`` from a file or the embedded data set.

    A label is kept when it reads as an integer class id.

    Args:
        spec: a path or ``"rotten_tomatoes"``.
        split: for the embedded data: ``train``, ``validation`` or ``test`` (default all).
        text_column: the column holding the text (see :func:`~attnlab.data.read_texts`).
        limit: keep the first ``limit`` texts.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if spec == EMBEDDED:
        splits = load_rotten_tomatoes()
        rows: list[tuple[str, Optional[int]]] = []
        for name in [split] if split else ["train", "validation", "test"]:
            try:
                examples = splits[name]
            except KeyError as error:
                raise ValueError(f"split must be train, validation or test, got {name!r}") from error
            rows.extend((text, _label(label)) for text, label in examples)
        return rows[:limit]
    if not Path(spec).is_file():
        raise FileNotFoundError(f"--data {spec!r} is neither a file nor {EMBEDDED!r}")
    return [(text, _label(label)) for text, label in read_texts(spec, text_column=text_column)][:limit]
