"""Bad input to every command: exit 2, one line naming what was wrong, no traceback,
and nothing written that would block the corrected command."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.cli import main
from attnlab.data import DataError, Tokenizer, read_texts, train_tokenizer
from attnlab.models import load_model
from attnlab.train.run_config import resolve_run_config

TEXTS = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 16, 2, 2, 32, max_len=32, pad_id=tokenizer.pad_token_id)
    good = root / "model"
    EncoderClassifier(encoder, 2, label_names=["neg", "pos"]).save_pretrained(good, tokenizer=tokenizer)
    truncated = root / "truncated"
    EncoderClassifier(encoder, 2).save_pretrained(truncated, tokenizer=tokenizer)
    weights = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    garbage = root / "garbage"
    EncoderClassifier(encoder, 2).save_pretrained(garbage, tokenizer=tokenizer)
    (garbage / "config.json").write_text("{not json", encoding="utf-8")
    (root / "empty").mkdir()
    (root / "a_file.txt").write_text("hello\n", encoding="utf-8")
    (root / "no_text_column.csv").write_text("label,body\npos,a fine film\n", encoding="utf-8")
    (root / "no_label.csv").write_text("text\na fine film\n", encoding="utf-8")
    (root / "bad.jsonl").write_text('{"text": "fine", "label": "pos"}\n{oops\n', encoding="utf-8")
    (root / "data.xlsx").write_bytes(b"PK\x03\x04")
    (root / "latin1.csv").write_bytes("text,label\ncaf\xe9,pos\n".encode("latin-1"))
    (root / "garbage.toml").write_text("[train\nepochs = ", encoding="utf-8")
    mine = root / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my own file\n", encoding="utf-8")
    return {"root": root, "model": good, "truncated": truncated, "garbage": garbage}


def _cases(files: dict[str, Path]) -> list[tuple[list[str], str]]:
    root, model = files["root"], str(files["model"])
    out = str(root / "never-written")
    return [
        (["train", "--out", str(root / "a_file.txt")], "is a file"),
        (["train", "--out", out, "--device", "foo"], "--device 'foo' is not a device"),
        (["train", "--out", out, "--device", "cuda"], "no usable GPU"),
        (["train", "--out", out, "--data", str(root / "missing.csv")], "does not exist"),
        (["train", "--out", out, "--data", str(root / "no_label.csv")], "label"),
        (["train", "--out", out, "--data", str(root / "bad.jsonl")], "bad.jsonl:2"),
        (["train", "--out", out, "--data", str(root / "data.xlsx")], "cannot tell the format"),
        (["train", "--out", out, "--data", str(root / "latin1.csv")], "not valid UTF-8"),
        (["train", "--out", out, "--set", "train.epochs=-1"], "epochs"),
        (["train", "--out", out, "--set", "nonsense.key=1"], "nonsense"),
        (["train", "--out", out, "--set", "train.precision=fp16"], "needs a GPU"),
        (["train", "--out", out, "--config", str(root / "missing.toml")], "missing.toml"),
        (["train", "--out", out, "--config", str(root / "garbage.toml")], "garbage.toml"),
        (["train", "--out", str(root / "empty"), "--resume"], "holds no attnlab run"),
        (["train", "--out", out, "--resume", "--overwrite"], "pass one of them"),
        (["train", "--out", str(root / "mine")], "--overwrite"),
        (["train", "--epochs", "3"], "unrecognized arguments"),
        (["demo", "--out", str(root / "a_file.txt")], "is a file"),
        (["demo", "--out", str(root / "mine")], "--overwrite"),
        (["demo", "--out", out, "--set", "train.epochs=x"], "epochs"),
        (["inspect", "--model", str(root / "missing"), "--text", "hi", "--out", out], "no such directory"),
        (["inspect", "--model", str(root / "empty"), "--text", "hi", "--out", out], "holds no model"),
        (["inspect", "--model", str(files["truncated"]), "--text", "hi", "--out", out], "model.safetensors"),
        (["inspect", "--model", str(files["garbage"]), "--text", "hi", "--out", out], "config.json"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--max-length", "1000"], "--max-length 1000"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--max-length", "1"], "at least 2"),
        (["analyze", "--model", model, "--data", str(root / "missing.csv"), "--out", out], "is neither a file"),
        (["analyze", "--model", model, "--data", str(root / "no_text_column.csv"), "--out", out],
         "no text column"),
        (["analyze", "--model", model, "--data", str(root / "bad.jsonl"), "--out", out], "bad.jsonl:2"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--limit", "0"], "--limit"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--batch-size", "0"],
         "--batch-size"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--mask-heads", "0:1"],
         "numbered from 1"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--mask-heads", "9:1"],
         "layer_9"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--method", "lime"], "invalid choice"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--steps", "0"], "--steps"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--target", "happy"], "'happy'"),
        (["explain", "--model", model, "--text", "   ", "--out", out], "non-empty"),
        (["explain", "--model", model, "--text", "hi", "--out", str(root / "a_file.txt")], "is a file"),
        (["compare", "--model", model, "--data", "rotten_tomatoes", "--out", out], "exactly twice"),
        (["compare", "--model", model, "--model", str(root / "missing"), "--data", "rotten_tomatoes",
          "--out", out], "no such directory"),
        (["compare", "--model", model, "--model", model, "--data", "rotten_tomatoes", "--out", out,
          "--limit", "0"], "--limit"),
        *[([command, "--model", model, *rest, "--dtype", "fp8"], "argument --dtype: invalid choice")
          for command, rest in (("inspect", ["--text", "hi", "--out", out]), ("generate", ["--prompt", "hi"]),
                                ("analyze", ["--data", "rotten_tomatoes", "--out", out]),
                                ("explain", ["--text", "hi", "--out", out]),
                                ("compare", ["--model", model, "--data", "rotten_tomatoes", "--out", out]))],
        (["image-attention", "--run", model, "--out", out, "--examples", "0"], "--examples"),
        (["image-attention", "--run", model, "--out", out], "not an image_text"),
        (["image-attention", "--run", str(root / "missing"), "--out", out], "does not exist"),
    ]


def test_every_command_answers_bad_input_with_one_line_and_exit_2(files, capsys):
    failures = []
    for argv, expected in _cases(files):
        try:
            code = main(argv)
        except SystemExit as stop:  # argparse
            code = stop.code
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        if code != 2 or len(lines) != 1 or "Traceback" in captured.err or expected not in lines[0]:
            failures.append(f"{' '.join(argv)} -> exit {code}, stderr {captured.err!r}")
    assert not failures, "\n".join(failures)
    assert not (files["root"] / "never-written").exists()  # validated before writing
    assert (files["root"] / "mine" / "notes.txt").read_text() == "my own file\n"


_KEYS = ["train.epochs", "train.learning_rate", "train.batch_size", "model.d_model", "model.num_heads",
         "data.max_length", "train.precision", "data.tokenizer", "model.dropout", "task"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(_KEYS), value=st.text(string.printable, max_size=12))
def test_any_set_value_is_accepted_or_refused_with_a_value_error(key, value):
    try:
        resolve_run_config(None, [f"{key}={value}"])
    except (ValueError, TypeError) as error:  # the CLI prints it as one line and exits 2
        assert str(error).strip() and "\n" not in str(error).strip(), repr(str(error))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), suffix=st.sampled_from([".csv", ".tsv", ".jsonl", ".txt"]))
def test_damaged_data_files_give_data_errors_only(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("data") / f"damaged{suffix}"
    path.write_bytes(data)
    try:
        read_texts(path, text_column="text")
    except DataError as error:
        assert str(path) in str(error)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0.0, 0.999), flip=st.integers(0, 10_000))
def test_damaged_checkpoints_give_one_error_naming_the_file(files, tmp_path_factory, fraction, flip):
    directory = tmp_path_factory.mktemp("damaged")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        (directory / name).write_bytes((files["model"] / name).read_bytes())
    weights = (files["model"] / "model.safetensors").read_bytes()
    damaged = bytearray(weights[: int(len(weights) * fraction)])
    if damaged:
        damaged[flip % len(damaged)] ^= 0xFF
    (directory / "model.safetensors").write_bytes(bytes(damaged))
    try:
        load_model(directory)
    except ValueError as error:
        assert "model.safetensors" in str(error) or "config.json" in str(error), str(error)


def test_a_failed_start_does_not_block_the_corrected_command(files, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--data", str(files["root"] / "missing.csv")]) == 2
    assert not out.exists()
    # a run whose config was written but that never trained is replaced by the next start
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}), encoding="utf-8")
    from attnlab.train.run_dir import check_out_dir

    check_out_dir(out)
    assert not (out / "config.json").exists()


def test_overwrite_never_removes_files_attnlab_did_not_write(tmp_path):
    from attnlab.train.run_dir import check_out_dir

    out = tmp_path / "run"
    (out / "checkpoints" / "best").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}), encoding="utf-8")
    (out / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    (out / "my_notes.md").write_text("keep me\n", encoding="utf-8")
    with pytest.raises(ValueError, match="already holds a run; pass --resume to continue it, --overwrite"):
        check_out_dir(out)
    notice = check_out_dir(out, overwrite=True)
    assert sorted(entry.name for entry in out.iterdir()) == ["my_notes.md"]
    assert "kept yours: my_notes.md" in notice


def test_demo_replaces_its_own_run_but_not_a_train_run(tmp_path):
    from attnlab.train.run_dir import DEMO_MARK, check_out_dir

    out = tmp_path / "demo"
    out.mkdir()
    (out / DEMO_MARK).write_text("", encoding="utf-8")
    (out / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}), encoding="utf-8")
    (out / "test_report.json").write_text("{}", encoding="utf-8")
    check_out_dir(out, demo=True)
    assert not any(out.iterdir())
    (out / "config.json").write_text(json.dumps({"model": {}, "data": {}, "train": {}}), encoding="utf-8")
    (out / "test_report.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="already holds a run; pass --overwrite to replace it"):
        check_out_dir(out, demo=True)


def test_version():
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
