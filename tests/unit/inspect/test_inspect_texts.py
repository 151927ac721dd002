"""Loading texts for `analyze` and turning them into padded batches."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect import as_analysis_batch
from attnlab.data import encode_batches, load_texts


def test_text_csv_and_jsonl_files(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "b.csv").write_text("id,review,label\n1,good film,1\n2,bad film,0\n")
    (tmp_path / "c.jsonl").write_text('{"text": "x y", "label": 1}\n{"text": "z"}\n')
    assert load_texts(str(tmp_path / "a.txt")) == [("first line", None), ("second line", None)]
    assert load_texts(str(tmp_path / "b.csv")) == [("good film", 1), ("bad film", 0)]
    assert load_texts(str(tmp_path / "b.csv"), text_column="id", limit=1) == [("1", 1)]
    assert load_texts(str(tmp_path / "c.jsonl")) == [("x y", 1), ("z", None)]
    with pytest.raises(FileNotFoundError, match="nope"):
        load_texts(str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="column"):
        load_texts(str(tmp_path / "b.csv"), text_column="missing")


def test_batches_drop_tokenizer_padding_and_sort_by_length(tokenizer):
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=20)  # must not leak into the batches
    rows = [("the movie was great", 1), ("bad", 0), ("a very boring plot , but fun acting !", 1)]
    batches = list(encode_batches(rows, tokenizer, batch_size=2, max_length=8, pad_id=0, pad_to_multiple=1))
    assert [batch["input_ids"].shape for batch in batches] == [(2, 6), (1, 8)]
    assert batches[0]["mask"].sum(-1).tolist() == [3, 6]  # [CLS] bad [SEP]; [CLS] 4 words [SEP]
    assert batches[0]["labels"].tolist() == [0, 1]
    normalised = as_analysis_batch(batches[0])
    assert normalised.mask_given and torch.equal(normalised.mask, batches[0]["mask"])


def test_batch_forms():
    ids = torch.tensor([[4, 5, 0]])
    assert as_analysis_batch(ids, pad_id=0).mask.tolist() == [[True, True, False]]
    assert as_analysis_batch((ids, torch.tensor([1]))).labels.tolist() == [1]
    with pytest.raises(ValueError, match="input_ids"):
        as_analysis_batch({"ids": ids})
    with pytest.raises(ValueError, match="mask"):
        as_analysis_batch({"input_ids": ids, "mask": torch.ones(1, 2)})
    with pytest.raises(ValueError, match="alignment"):
        as_analysis_batch({"input_ids": ids, "alignment": torch.ones(1, 3, 2)})
    with pytest.raises(TypeError, match="batch"):
        as_analysis_batch(3)


def test_embedded_data_splits(monkeypatch):
    class Splits:  # indexable by name only, like the data package's result
        def __getitem__(self, name):
            data = {"train": [("a", 1), ("b", 0)], "validation": [("c", 1)], "test": [("d", 0)]}
            if name not in data:
                raise KeyError(name)
            return data[name]

    monkeypatch.setattr("attnlab.data.texts.load_rotten_tomatoes", Splits)
    assert load_texts("rotten_tomatoes") == [("a", 1), ("b", 0), ("c", 1), ("d", 0)]
    assert load_texts("rotten_tomatoes", split="validation") == [("c", 1)]
    assert load_texts("rotten_tomatoes", limit=3)[-1] == ("c", 1)
    with pytest.raises(ValueError, match="split"):
        load_texts("rotten_tomatoes", split="dev")


def test_attention_cell_budget_shrinks_batches_of_long_texts(tokenizer):
    short = [("bad", 0)] * 6  # 3 tokens with [CLS] and [SEP]
    long = [("the movie was very very very boring and not fun", 1)] * 3  # 12 tokens
    batches = list(
        encode_batches(
            short + long, tokenizer, batch_size=4, max_attention_cells=4 * 3 * 3 + 1, pad_to_multiple=1
        )
    )
    sizes = [tuple(batch["input_ids"].shape) for batch in batches]
    assert sizes == [(4, 3), (2, 3), (1, 12), (1, 12), (1, 12)]
    assert sum(size[0] for size in sizes) == 9


def test_lengths_padded_to_a_multiple_within_max_length(tokenizer):
    rows = [("bad", 0), ("the movie was very very very boring and not fun", 1)]  # 3 and 12 tokens
    batches = list(encode_batches(rows, tokenizer, batch_size=1, max_length=14, pad_to_multiple=8))
    assert [tuple(batch["input_ids"].shape) for batch in batches] == [(1, 8), (1, 14)]
    assert [int(batch["mask"].sum()) for batch in batches] == [3, 12]
