import json

import pytest

from attnlab.data import DataError, load_text_classification, read_labelled_texts


def write_csv(path, rows, header="text,label"):
    path.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_csv_and_jsonl_with_custom_columns(tmp_path):
    csv_path = write_csv(tmp_path / "d.csv", ['"good, fine",pos', "bad,neg"], header="review,sentiment")
    assert read_labelled_texts(csv_path, text_column="review", label_column="sentiment") == [
        ("good, fine", "pos"), ("bad", "neg")]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps({"t": f"text {i}", "y": i % 2}) for i in range(20)) + "\n")
    splits = load_text_classification(jsonl, text_column="t", label_column="y")
    assert splits.label_names == ("0", "1")
    assert sum(splits.sizes().values()) == 20 and splits.sizes()["test"] == 2


def test_missing_column_is_named(tmp_path):
    path = write_csv(tmp_path / "d.csv", ["x,pos"], header="review,label")
    with pytest.raises(DataError, match=r"no column 'text'.*\['review', 'label'\]"):
        read_labelled_texts(path)


def test_missing_key_in_jsonl_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: missing label_column 'label'"):
        read_labelled_texts(path)


def test_empty_file(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("")
    with pytest.raises(DataError, match="empty"):
        read_labelled_texts(path)
    write_csv(path, [])
    with pytest.raises(DataError, match="no data rows"):
        read_labelled_texts(path)


def test_unknown_labels(tmp_path):
    path = write_csv(tmp_path / "d.csv", [f"t{i},{label}" for i, label in enumerate(["pos", "neg", "meh"] * 4)])
    with pytest.raises(DataError, match=r"unknown labels \['meh'\]"):
        load_text_classification(path, labels=["neg", "pos"])


def test_single_label_is_an_error(tmp_path):
    path = write_csv(tmp_path / "d.csv", [f"t{i},pos" for i in range(10)])
    with pytest.raises(DataError, match="at least two labels"):
        load_text_classification(path)


def test_bad_encoding(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes("text,label\ncaf\xe9,pos\n".encode("latin-1"))
    with pytest.raises(DataError, match="not valid UTF-8"):
        read_labelled_texts(path)


def test_bad_json_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 1}\n{oops\n')
    with pytest.raises(DataError, match=r":2: invalid JSON"):
        read_labelled_texts(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_labelled_texts("no/such/file.csv")


def test_training_and_analysis_read_files_by_the_same_rules(tmp_path):
    """One reader: the same BOM handling, the same errors, for `train` and `analyze`."""
    from attnlab.data import load_texts, read_texts

    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufefftext,label\ngood,1\n".encode("utf-8"))
    assert read_labelled_texts(bom) == [("good", "1")]
    assert load_texts(str(bom)) == [("good", 1)]
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "a", "label": 1}\n{"text": \n')
    empty_text = write_csv(tmp_path / "empty.csv", ["good,1", ",0"])
    latin = tmp_path / "latin.csv"
    latin.write_bytes("text,label\ncaf\xe9,1\n".encode("latin-1"))
    for path, message in ((bad_json, r"bad\.jsonl:2: invalid JSON"), (empty_text, r"empty\.csv:3: empty text"),
                          (latin, r"latin\.csv: not valid UTF-8")):
        with pytest.raises(DataError, match=message):
            read_labelled_texts(path)
        with pytest.raises(DataError, match=message):
            load_texts(str(path))
    missing = tmp_path / "m.jsonl"
    missing.write_text('{"review": "x"}\n{"other": "y"}\n')
    with pytest.raises(DataError, match=r"m\.jsonl:2: missing text_column 'review'"):
        read_texts(missing)


def test_texts_without_labels_come_from_txt_csv_and_jsonl(tmp_path):
    from attnlab.data import read_texts

    (tmp_path / "a.txt").write_text("one\n\n two \n")
    (tmp_path / "b.tsv").write_text("sentence\tlabel\nx y\tpos\nz\t\n")
    assert read_texts(tmp_path / "a.txt") == [("one", None), ("two", None)]
    assert read_texts(tmp_path / "b.tsv") == [("x y", "pos"), ("z", None)]
    with pytest.raises(DataError, match="format must be one of"):
        read_labelled_texts(tmp_path / "a.txt")
