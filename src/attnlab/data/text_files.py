"""Text files, read by one set of rules for training, ``inspect`` and ``analyze``.

CSV (a header row; ``.tsv`` tab-separated), JSONL (one object a line) and, where no
labels are needed, plain text (one text a line). Every reader raises
:class:`~attnlab.data.DataError` naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional, Sequence, Union

from ._errors import DataError
from .splits import DatasetSplits, Example, split_examples

__all__ = [
    "FORMATS", "TEXT_FORMATS", "TEXT_COLUMNS", "detect_format", "read_rows", "read_labelled_texts",
    "read_texts", "load_text_classification", "label_order", "choose_text_column",
]

FORMATS = ("csv", "jsonl")  # files with labels, for training
TEXT_FORMATS = ("csv", "jsonl", "txt")  # files of texts, labels optional, for inspection
TEXT_COLUMNS = ("text", "sentence", "review", "content")  # a CSV's text column, when none is named
_SUFFIXES = {
    ".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".txt": "txt",
}


def detect_format(path: Path, format: Optional[str] = None, *, allowed: Sequence[str] = TEXT_FORMATS) -> str:
    """``format`` if given, else the format the file's suffix names (``.csv``/``.tsv``,
    ``.jsonl``/``.ndjson``/``.json``, ``.txt``); one of ``allowed``."""
    if format is None:
        format = _SUFFIXES.get(path.suffix.lower())
        if format is None:
            raise DataError(f"{path}: cannot tell the format from the suffix {path.suffix.lower()!r}; "
                            f"pass format= one of {tuple(allowed)}")
    if format not in allowed:
        raise DataError(f"format must be one of {tuple(allowed)}, got {format!r}")
    return format


def _read_text(path: Path) -> str:
    if not path.is_file():
        problem = "is a directory; name a CSV, TSV, JSONL or TXT file" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"data file {path} {problem}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path}: not valid UTF-8 (byte {error.start}: {raw[error.start:error.start + 1]!r}); "
            f"re-encode the file as UTF-8"
        ) from None
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    return text


def _csv_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict]]]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    # The csv module refuses fields over 128 KiB by default; a whole document in one cell
    # is ordinary here. The limit is the module's, so it is restored afterwards.
    previous_limit = csv.field_size_limit(max(len(text), 131072))
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        columns = list(reader.fieldnames or [])
        try:
            rows = [(index + 2, row) for index, row in enumerate(reader)]  # line 1 is the header
        except csv.Error as error:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV ({error})") from None
    finally:
        csv.field_size_limit(previous_limit)
    return columns, rows


def _jsonl_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, dict]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{number}: invalid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: each line must be a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    columns = sorted({key for _, row in rows for key in row})
    return columns, rows


def _txt_rows(text: str) -> tuple[list[str], list[tuple[int, dict]]]:
    lines = enumerate(text.splitlines(), start=1)
    rows = [(number, {"text": line.strip()}) for number, line in lines if line.strip()]
    return ["text"], rows


def read_rows(path: Union[str, Path], *, format: Optional[str] = None,
              allowed: Sequence[str] = TEXT_FORMATS) -> tuple[str, list[str], list[tuple[int, dict]]]:
    """``(format, columns, [(line number, row dict), ...])`` of a CSV, JSONL or text file.

    A ``.txt`` file is one text a line (column ``text``; blank lines skipped).

    Raises:
        FileNotFoundError: the file does not exist.
        DataError: unknown format, bad encoding, empty file, invalid JSON, no data rows;
            the message names the file (and the line).
    """
    path = Path(path)
    kind = detect_format(path, format, allowed=allowed)
    text = _read_text(path)
    if kind == "csv":
        columns, rows = _csv_rows(path, text)
    elif kind == "jsonl":
        columns, rows = _jsonl_rows(path, text)
    else:
        columns, rows = _txt_rows(text)
    if not rows:
        raise DataError(f"{path}: no data rows")
    return kind, columns, rows


def _texts_and_labels(
    path: Path, kind: str, columns: list[str], rows: list[tuple[int, dict]], text_column: str,
    label_column: Optional[str], label_required: bool,
) -> list[tuple[str, Optional[str]]]:
    """The text and label of every row, by the same rules for every caller."""
    required = [(text_column, "text_column")] + ([(label_column, "label_column")] if label_required else [])
    for column, role in required:
        if kind == "csv" and column not in columns:
            likely = next((name for name in TEXT_COLUMNS if name in columns), None) if role == "text_column" else None
            hint = (f"; {likely!r} looks like the text: name it (data.text_column in train, --text-column in "
                    f"analyze)" if likely else "")
            raise DataError(f"{path}: no column {column!r} ({role}); the columns are {columns}{hint}")
    pairs = []
    for line, row in rows:
        for column, role in required:
            if row.get(column) is None:
                raise DataError(f"{path}:{line}: missing {role} {column!r}; this row has {sorted(row)}")
        text_value = str(row[text_column]).strip()
        label = row.get(label_column) if label_column is not None else None
        label_value = None if label is None or not str(label).strip() else str(label).strip()
        if not text_value:
            raise DataError(f"{path}:{line}: empty text in column {text_column!r}")
        if label_required and label_value is None:
            raise DataError(f"{path}:{line}: empty label in column {label_column!r}")
        pairs.append((text_value, label_value))
    return pairs


def read_labelled_texts(
    path: Union[str, Path],
    *,
    text_column: str = "text",
    label_column: str = "label",
    format: Optional[str] = None,
) -> list[tuple[str, str]]:
    """Read ``(text, label)`` string pairs from a CSV (header row) or JSONL file.

    Raises:
        FileNotFoundError: the file does not exist.
        DataError: bad encoding, empty file, no rows, a missing column, an empty text
            or label; the message names the file and the line.
    """
    path = Path(path)
    kind, columns, rows = read_rows(path, format=format, allowed=FORMATS)
    return _texts_and_labels(path, kind, columns, rows, text_column, label_column, label_required=True)


def read_texts(
    path: Union[str, Path],
    *,
    text_column: Optional[str] = None,
    label_column: str = "label",
    format: Optional[str] = None,
) -> list[tuple[str, Optional[str]]]:
    """Read ``(text, label or None)`` pairs from a CSV, JSONL or text file; labels are optional.

    Args:
        text_column: the column holding the text; default the first of
            :data:`TEXT_COLUMNS` a CSV file has, ``text`` in JSONL. A CSV file with none
            of them is refused with its columns listed (never a guess: its first column
            is often the labels).
        label_column: the column holding labels, where a row has one.

    Raises:
        FileNotFoundError, DataError: as :func:`read_labelled_texts`, by the same rules.
    """
    path = Path(path)
    kind, columns, rows = read_rows(path, format=format)
    text_column = _choose_text_column(path, kind, columns, text_column)
    return _texts_and_labels(path, kind, columns, rows, text_column, label_column, label_required=False)


def _choose_text_column(path: Path, kind: str, columns: list[str], text_column: Optional[str]) -> str:
    if text_column is not None:
        return text_column
    chosen = next((name for name in TEXT_COLUMNS if name in columns), None)
    if chosen is None and kind == "csv":
        raise DataError(
            f"{path}: no text column: the columns are {columns}, none of {list(TEXT_COLUMNS)}; "
            f"name the text column with --text-column (text_column=)"
        )
    return chosen or "text"


def choose_text_column(path: Union[str, Path], *, text_column: Optional[str] = None,
                       format: Optional[str] = None) -> str:
    """The column :func:`read_texts` reads the texts from (``text`` for a ``.txt`` file).

    Training takes ``text`` unless told otherwise; ``read_texts`` also takes ``sentence``,
    ``review`` or ``content``, so a command that reads a file by that rule says which.
    """
    path = Path(path)
    kind, columns, _ = read_rows(path, format=format)
    return _choose_text_column(path, kind, columns, text_column)


def label_order(labels: set[str]) -> list[str]:
    """Labels in class-id order: numerically when every label is an integer (``2`` before
    ``10``), else alphabetically."""
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


def load_text_classification(
    path: Union[str, Path],
    *,
    text_column: str = "text",
    label_column: str = "label",
    labels: Optional[Sequence[str]] = None,
    format: Optional[str] = None,
    seed: int = 0,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> DatasetSplits:
    """Read a labelled CSV/JSONL file and split it like the embedded data set.

    Args:
        labels: the allowed label names in label-id order; a row with any other label
            is an error. ``None``: the sorted set of labels found in the file.

    Raises:
        DataError: see :func:`read_labelled_texts`; also unknown labels and files with
            fewer than two labels.
    """
    pairs = read_labelled_texts(path, text_column=text_column, label_column=label_column, format=format)
    found = label_order({label for _, label in pairs})
    if labels is None:
        label_names = tuple(found)
    else:
        label_names = tuple(str(label) for label in labels)
        unknown = sorted(set(found) - set(label_names))
        if unknown:
            raise DataError(f"{path}: unknown labels {unknown[:10]}; the allowed labels are {list(label_names)}")
    if len(label_names) < 2:
        raise DataError(f"{path}: a classifier needs at least two labels, found {found}")
    index = {name: i for i, name in enumerate(label_names)}
    examples: list[Example] = [(text, index[label]) for text, label in pairs]
    return split_examples(
        examples, label_names, seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction
    )
