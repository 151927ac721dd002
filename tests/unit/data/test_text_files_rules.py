"""Reader rules from the bad-input review: big fields, no text column, numeric labels."""

from __future__ import annotations

import pytest

from attnlab.data import DataError, load_text_classification, read_texts
from attnlab.data.text_files import label_order


def test_a_csv_field_over_128_kib_is_read(tmp_path) -> None:
    big = "word " * 60_000  # 300 KB in one cell
    path = tmp_path / "big.csv"
    path.write_text(f'text,label\n"{big}",pos\nshort,neg\n', encoding="utf-8")
    rows = read_texts(path)
    assert len(rows) == 2 and rows[0][0] == big.strip()  # texts are stripped


def test_a_csv_without_a_text_column_is_refused_with_its_columns(tmp_path) -> None:
    path = tmp_path / "odd.csv"
    path.write_text("label,body\npos,a fine film\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"no text column: the columns are \['label', 'body'\].*--text-column"):
        read_texts(path)
    assert read_texts(path, text_column="body") == [("a fine film", "pos")]


def test_integer_labels_are_ordered_numerically(tmp_path) -> None:
    assert label_order({"10", "2", "0", "1"}) == ["0", "1", "2", "10"]
    assert label_order({"pos", "neg"}) == ["neg", "pos"]
    path = tmp_path / "digits.csv"
    rows = [f"text {i},{i % 12}" for i in range(48)]
    path.write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    splits = load_text_classification(path)
    assert list(splits.label_names) == [str(i) for i in range(12)]
