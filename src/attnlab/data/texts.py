"""Texts to look inside: a file or the embedded data set, as ``(text, label id or None)``.

``attnlab analyze --data`` takes a ``.txt`` file (one text a line), a ``.csv`` file
(column ``text`` or the one named, labels from ``label`` when present), a ``.jsonl``
file (``{"text": ..., "label": ...}`` a line), all read by
:func:`attnlab.data.text_files.read_texts`, or ``rotten_tomatoes``, the embedded data
set (all splits in order, or the one named).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from .rotten_tomatoes import load_rotten_tomatoes
from .text_files import read_texts

__all__ = ["EMBEDDED", "load_texts"]

EMBEDDED = "rotten_tomatoes"


def _label(value: Any, label_names: Optional[Sequence[str]] = None) -> Optional[int]:
    if label_names and value is not None and str(value) in label_names:
        return list(label_names).index(str(value))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def load_texts(
    spec: str, *, split: Optional[str] = None, text_column: Optional[str] = None, limit: Optional[int] = None,
    label_names: Optional[Sequence[str]] = None,
) -> list[tuple[str, Optional[int]]]:
    """``[(text, label or None), ...]`` from a file or the embedded data set.

    A label is kept when it reads as an integer class id.

    Args:
        spec: a path or ``"rotten_tomatoes"``.
        split: for the embedded data: ``train``, ``validation`` or ``test`` (default all).
        text_column: the column holding the text (see :func:`~attnlab.data.read_texts`).
        limit: keep the first ``limit`` texts.
        label_names: the model's class names: a label that is one of them becomes its
            index (``"pos"`` -> 1); otherwise a label is kept when it reads as a class id.
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
    if split is not None:
        raise ValueError(f"--split {split!r} selects a part of the embedded {EMBEDDED!r}; a file is read whole: "
                         f"drop --split")
    if not Path(spec).is_file():
        if Path(spec).is_dir():
            raise FileNotFoundError(f"--data {spec!r} is a directory; name a .txt/.csv/.jsonl file or {EMBEDDED!r}")
        raise FileNotFoundError(f"--data {spec!r} is neither a file nor {EMBEDDED!r}")
    return [(text, _label(label, label_names)) for text, label in read_texts(spec, text_column=text_column)][:limit]
