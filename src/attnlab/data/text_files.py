"""Your own labelled text: CSV or JSONL files with a text column and a label column."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional, Sequence, Union

from ._errors import DataError
from .splits import DatasetSplits, Example, split_examples

__all__ = ["read_labelled_texts", "load_text_classification", "FORMATS"]

FORMATS = ("csv", "jsonl")


def _detect_format(path: Path, format: Optional[str]) -> str:
    if format is not None:
        if format not in FORMATS:
            raise DataError(f"format must be one of {FORMATS}, got {format!r}")
        return format
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    raise DataError(f"{path}: cannot tell the format from the suffix {suffix!r}; pass format='csv' or 'jsonl'")


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
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
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    columns = list(reader.fieldnames or [])
    rows = [(index + 2, row) for index, row in enumerate(reader)]  # line 1 is the header
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
    kind = _detect_format(path, format)
    text = _read_text(path)
    columns, rows = _csv_rows(path, text) if kind == "csv" else _jsonl_rows(path, text)
    if not rows:
        raise DataError(f"{path}: no data rows")
    for column, role in ((text_column, "text_column"), (label_column, "label_column")):
        if kind == "csv" and column not in columns:
            raise DataError(f"{path}: no column {column!r} ({role}); the columns are {columns}")
    pairs = []
    for line, row in rows:
        for column, role in ((text_column, "text_column"), (label_column, "label_column")):
            if row.get(column) is None:
                raise DataError(f"{path}:{line}: missing {role} {column!r}; this row has {sorted(row)}")
        text_value, label_value = str(row[text_column]).strip(), str(row[label_column]).strip()
        if not text_value:
            raise DataError(f"{path}:{line}: empty text in column {text_column!r}")
        if not label_value:
            raise DataError(f"{path}:{line}: empty label in column {label_column!r}")
        pairs.append((text_value, label_value))
    return pairs


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
    found = sorted({label for _, label in pairs})
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
