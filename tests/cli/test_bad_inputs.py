"""Bad input to every command: exit 2, one line naming what was wrong, no traceback,
and nothing written that would block the corrected command."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.cli import main
from attnlab.data import DataError, Tokenizer, read_texts, train_tokenizer
from attnlab.checkpoints import load_model
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
    reviews = "".join(f"{text},{'pos' if index % 2 else 'neg'}\n" for index, text in enumerate(TEXTS))
    (root / "reviews.csv").write_text("review,label\n" + reviews, encoding="utf-8")
    (root / "bad.jsonl").write_text('{"text": "fine", "label": "pos"}\n{oops\n', encoding="utf-8")
    (root / "data.xlsx").write_bytes(b"PK\x03\x04")
    (root / "latin1.csv").write_bytes("text,label\ncaf\xe9,pos\n".encode("latin-1"))
    (root / "garbage.toml").write_text("[train\nepochs = ", encoding="utf-8")
    labelled = "".join(f"{text},{'pos' if index % 2 else 'neg'}\n" for index, text in enumerate(TEXTS))
    (root / "labelled.csv").write_text("text,label\n" + labelled, encoding="utf-8")
    (root / "three_rows.csv").write_text("text,label\nfine,pos\ndull,neg\ngreat,pos\n", encoding="utf-8")
    (root / "one_label.csv").write_text("text,label\n" + "a fine film,pos\n" * 20, encoding="utf-8")
    (root / "t5").mkdir()
    (root / "t5" / "config.json").write_text('{"model_type": "t5", "d_model": 32}', encoding="utf-8")
    stale = root / "stale_run"
    stale.mkdir()
    (stale / "config.json").write_text(json.dumps(
        {"model": {}, "data": {"validation_fraction": 0.0}, "train": {}}), encoding="utf-8")
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
        # analyze reads a 'review' column; train refused it without saying what to set
        (["train", "--out", out, "--data", str(root / "reviews.csv")],
         "'review' looks like the text: name it (data.text_column in train"),
        (["train", "--out", out, "--data", str(root / "bad.jsonl")], "bad.jsonl:2"),
        (["train", "--out", out, "--data", str(root / "data.xlsx")], "cannot tell the format"),
        (["train", "--out", out, "--data", str(root / "latin1.csv")], "not valid UTF-8"),
        (["train", "--out", out, "--set", "train.epochs=-1"], "epochs"),
        (["train", "--out", out, "--set", "nonsense.key=1"], "nonsense"),
        (["train", "--out", out, "--set", "data.vocab_size=3"], "data.vocab_size must exceed 5"),  # was "vocab_size"
        (["train", "--out", out, "--set", "train.precision=fp16"], "needs a GPU"),
        (["train", "--out", out, "--config", str(root / "missing.toml")], "missing.toml"),
        (["train", "--out", out, "--config", str(root / "garbage.toml")], "garbage.toml"),
        (["train", "--out", str(root / "empty"), "--resume"], "holds no attnlab run"),
        (["train", "--out", out, "--resume", "--overwrite"], "pass one of them"),
        (["train", "--out", str(root / "mine")], "--overwrite"),
        (["train", "--epochs", "3"], "unrecognized arguments"),
        # sizes and data checked before anything is written (each used to train, then fail, or leave files)
        (["train", "--out", out, "--set", "data.max_length=1000000000"], "data.max_length=1000000000"),
        (["train", "--out", out, "--set", "data.validation_fraction=0"], "data.validation_fraction"),
        (["train", "--out", out, "--set", "data.test_fraction=1.5"], "data.test_fraction"),
        (["train", "--out", out, "--data", str(root / "three_rows.csv")], "empty validation split"),
        (["train", "--out", out, "--data", str(root / "one_label.csv")], "at least two labels"),
        (["train", "--out", out, "--data", str(root / "labelled.csv"), "--set", 'data.labels=["good", "bad"]'],
         "unknown labels"),
        (["train", "--out", out, "--set", f"model.pretrained={json.dumps(str(root / 't5'))}"], "'t5'"),
        (["train", "--out", out, "--set", 'model.pretrained="minilm"', "--set", "data.max_length=100000"],
         "512 positions"),
        (["train", "--out", str(root / "stale_run"), "--resume"], "data.validation_fraction"),
        (["train", "--out", out, "--set", 'model.pretrained="minilm"', "--set", "model.d_model=64"],
         "has no effect beside model.pretrained"),
        (["demo", "--out", str(root / "a_file.txt")], "is a file"),
        (["demo", "--out", str(root / "mine")], "--overwrite"),
        (["demo", "--out", out, "--set", "train.epochs=x"], "epochs"),
        (["inspect", "--model", str(root / "missing"), "--text", "hi", "--out", out], "no such file or directory"),
        (["inspect", "--model", str(root / "empty"), "--text", "hi", "--out", out], "holds no model"),
        (["inspect", "--model", str(files["truncated"]), "--text", "hi", "--out", out], "model.safetensors"),
        (["inspect", "--model", str(files["garbage"]), "--text", "hi", "--out", out], "config.json"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--max-length", "1000"], "--max-length 1000"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--max-length", "1"], "at least 2"),
        # refused before any picture is written (these used to come after them)
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--window", "5:2"], "--window"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--window", "50:60"], "below the text's"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--max-tokens", "0"], "--max-tokens"),
        (["inspect", "--model", model, "--text", "hi", "--out", out, "--layer", "9"], "1..2"),
        (["analyze", "--model", model, "--data", str(root / "missing.csv"), "--out", out], "is neither a file"),
        (["analyze", "--model", model, "--data", str(root / "no_text_column.csv"), "--out", out],
         "no text column"),
        (["analyze", "--model", model, "--data", str(root / "bad.jsonl"), "--out", out], "bad.jsonl:2"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--limit", "0"], "--limit"),
        # messages that name what is wrong, not something else
        (["analyze", "--model", model, "--data", str(root / "mine"), "--out", out], "is a directory"),
        (["train", "--out", out, "--data", str(root / "mine")], "is a directory"),
        (["train", "--out", out, "--config", str(root / "mine")], "is a directory; name a TOML file"),
        (["analyze", "--model", model, "--data", str(root / "labelled.csv"), "--split", "train", "--out", out],
         "drop --split"),
        (["analyze", "--model", model, "--data", str(root / "no_label.csv"), "--out", out, "--importance"],
         "label names ['neg', 'pos']"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--batch-size", "0"],
         "--batch-size"),
        # named by their flags and refused before the model loads (--max-attention-cells 0 came after the
        # progress bar started; --top-k 0 said "top_k")
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--top-k", "0"], "--top-k"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--sparsity-threshold", "5"],
         "--sparsity-threshold"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--sparsity-threshold", "nan"],
         "--sparsity-threshold"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--max-attention-cells", "0"],
         "--max-attention-cells"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--mask-heads", "0:1"],
         "numbered from 1"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--mask-heads", "9:1"],
         "layer_9"),
        (["analyze", "--model", model, "--data", "rotten_tomatoes", "--out", out, "--mask-heads", "1:5"],
         "--mask-heads counts them 1..2), got head index 4 (head 5 counted from 1)"),  # said "head index 4" alone
        (["explain", "--model", model, "--text", "hi", "--out", out, "--method", "lime"], "invalid choice"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--steps", "0"], "--steps"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--steps", "100000"], "1..1000"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--target", "happy"], "'happy'"),
        (["explain", "--model", model, "--text", "hi", "--out", out, "--baseline", "zeros"],
         "--baseline must be one of pad, zero, mean"),
        (["explain", "--model", model, "--text", "   ", "--out", out], "non-empty"),
        (["explain", "--model", model, "--text", "hi", "--out", str(root / "a_file.txt")], "is a file"),
        (["compare", "--model", model, "--data", "rotten_tomatoes", "--out", out], "exactly twice"),
        (["compare", "--model", model, "--model", str(root / "missing"), "--data", "rotten_tomatoes",
          "--out", out], "no such file or directory"),
        (["compare", "--model", model, "--model", model, "--data", "rotten_tomatoes", "--out", out,
          "--limit", "0"], "--limit"),
        *[([command, "--model", model, *rest, "--dtype", "fp8"], "argument --dtype: invalid choice")
          for command, rest in (("inspect", ["--text", "hi", "--out", out]), ("generate", ["--prompt", "hi"]),
                                ("analyze", ["--data", "rotten_tomatoes", "--out", out]),
                                ("explain", ["--text", "hi", "--out", out]),
                                ("compare", ["--model", model, "--data", "rotten_tomatoes", "--out", out]))],
        (["image-attention", "--run", model, "--out", out, "--examples", "0"], "--examples"),
        (["image-attention", "--run", model, "--out", out, "--examples", "100000"], "1..100"),  # drew thousands
        (["image-attention", "--run", model, "--out", out], "not an image_text"),
        (["image-attention", "--run", str(root / "missing"), "--out", out], "does not exist"),
    ]


def _output_cases(files: dict[str, Path], place: str) -> list[list[str]]:
    """Every command with ``place`` as the output it writes."""
    root, model = files["root"], str(files["model"])
    data = str(root / "texts.txt")
    return [
        ["train", "--out", place, "--data", data],
        ["demo", "--out", place],
        ["inspect", "--model", model, "--text", "hi", "--out", place],
        ["analyze", "--model", model, "--data", data, "--out", place],
        ["explain", "--model", model, "--text", "hi", "--out", place],
        ["generate", "--model", model, "--prompt", "hi", "--report", place],
        ["compare", "--model", model, "--model", model, "--data", data, "--out", place],
        ["image-attention", "--run", model, "--out", place],
    ]


def _run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse
        code = stop.code
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.strip()], captured.err


def test_every_commands_output_is_checked_before_any_work(files, capsys, monkeypatch):
    # Regression: an --out / --report that is a file, lies under a file or cannot be written
    # ended in FileExistsError / NotADirectoryError / PermissionError tracebacks, after the work.
    root = files["root"]
    (root / "texts.txt").write_text("a fine film\ndull and long\n", encoding="utf-8")
    locked = root / "locked"
    locked.mkdir(exist_ok=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if Path(path) == locked else real_access(path, mode, **kw)))  # also when tests run as root
    expectations = {
        "": "is empty",  # Path("") is the working directory: inspect wrote its pictures among the user's files
        str(root / "a_file.txt"): "is a file",
        str(root / "a_file.txt" / "sub"): "lies under the file",
        str(locked / "sub"): "may not write",
    }
    failures = []
    for place, expected in expectations.items():
        for argv in _output_cases(files, place):
            code, lines, err = _run(argv, capsys)
            if code != 2 or len(lines) != 1 or "Traceback" in err or expected not in lines[0]:
                failures.append(f"{' '.join(argv)} -> exit {code}, stderr {err!r}")
    assert not failures, "\n".join(failures)
    assert not any(locked.iterdir())


def test_aligns_output_file_is_checked_before_any_work(files, capsys, monkeypatch):
    # Regression: align --audio/--pairs --out under a file or in /proc loaded the model, then ended in a
    # bare "[Errno 17] File exists" or "[Errno 2] No such file or directory".
    root = files["root"]
    (root / "a_file.txt").write_text("x", encoding="utf-8")
    locked = root / "locked-align"
    locked.mkdir(exist_ok=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: (
        False if Path(path) == locked else real_access(path, mode, **kw)))  # also when tests run as root
    expectations = {"": "is empty", str(root): "is a directory",
                    str(root / "a_file.txt" / "words.json"): "lies under the file",
                    str(locked / "words.json"): "may not write"}
    if Path("/proc/self").is_dir():
        expectations["/proc/nope/words.json"] = "nothing can be written"
    failures = []
    for place, expected in expectations.items():
        for argv in (["align", "--model", str(files["model"]), "--audio", str(root / "clip.wav"), "--out", place],
                     ["align", "--model", str(files["model"]), "--pairs", str(root / "pairs.txt"), "--out", place]):
            code, lines, err = _run(argv, capsys)
            if code != 2 or len(lines) != 1 or "Traceback" in err or expected not in lines[0]:
                failures.append(f"{' '.join(argv)} -> exit {code}, stderr {err!r}")
    assert not failures, "\n".join(failures)
    assert not any(locked.iterdir())


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_under_a_read_only_directory_is_refused(files, tmp_path, capsys):
    locked = tmp_path / "read-only"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        code, lines, _ = _run(["explain", "--model", str(files["model"]), "--text", "hi", "--out",
                               str(locked / "why")], capsys)
    finally:
        locked.chmod(0o755)
    assert code == 2 and len(lines) == 1 and "may not write" in lines[0]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_where_nothing_can_be_made_is_refused_before_any_work(files, capsys, monkeypatch):
    """/proc passes the permission check for root, yet no directory can be made there: the
    command computed everything, then failed with a bare '[Errno 2] ... /proc/why'."""
    from attnlab.inspect.commands import explain_text

    def no_work(*args, **kwargs):
        raise AssertionError("explained before the output directory was checked")

    monkeypatch.setattr(explain_text, "explain", no_work)
    code, lines, _ = _run(["explain", "--model", str(files["model"]), "--text", "hi", "--out", "/proc/why"], capsys)
    assert code == 2 and len(lines) == 1 and "nothing can be written into /proc" in lines[0]


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


def test_generate_refuses_more_tokens_than_the_context_and_options_greedy_ignores(tiny_gguf, tmp_path, capsys):
    # Regression: --max-new-tokens 1000000000 allocated a cache of that many positions
    # (768 GB for smollm2), and --temperature without --sample was silently ignored.
    report = tmp_path / "report"
    cases = [
        (["--max-new-tokens", "1000000000", "--report", str(report)], "context of 64 positions; ask for at most"),
        (["--temperature", "0.5"], "--temperature shape(s) sampling"),
        (["--top-k", "3", "--seed", "1"], "add --sample"),
    ]
    for extra, expected in cases:
        code, lines, err = _run(["generate", "--model", str(tiny_gguf), "--prompt", "ab abc", *extra], capsys)
        assert code == 2 and len(lines) == 1 and expected in lines[0], err
    assert not report.exists()


def test_sizes_past_the_limits_are_refused_in_python_before_any_allocation():
    from attnlab import PositionalEncoding
    from attnlab.layers.decoder_config import DecoderConfig
    from attnlab.models.decoder import DecoderForCausalLM

    with pytest.raises(ValueError, match=r"max_len=1000000000\).* needs about .* GiB of memory"):
        PositionalEncoding(128, max_len=10**9)
    model = DecoderForCausalLM(DecoderConfig(vocab_size=20, d_model=8, num_layers=1, num_heads=2, d_ff=16,
                                             max_len=32)).eval()
    with pytest.raises(ValueError, match="context of 32 positions.*at most 29 new tokens"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=10**7)
    with pytest.raises(ValueError, match="input_ids is empty"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)
    assert model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=29).sequences.shape == (1, 32)
    from attnlab.inspect.compute.integrated_gradients import integrated_gradients

    with pytest.raises(ValueError, match="steps=100000 is more than 1000"):  # numpy asked for 74.5 GiB
        integrated_gradients(torch.nn.Identity(), torch.zeros(1, 3, dtype=torch.long), steps=100_000)


def test_importance_reads_the_models_label_names(files, tmp_path, capsys):
    # Regression: string labels ("pos", "neg") gave "--importance needs a label for every text",
    # after the whole statistics pass.
    out = tmp_path / "analysis"
    assert main(["analyze", "--model", str(files["model"]), "--data", str(files["root"] / "labelled.csv"),
                 "--out", str(out), "--importance", "--no-progress", "--format", "png"]) == 0
    statistics = json.loads((out / "statistics.json").read_text())
    assert len(statistics["head_importance"]) == 2  # [L][H]


def test_analyze_says_which_column_it_read_when_train_would_need_it_named(files, tmp_path, capsys):
    # Regression: analyze took a 'review' column silently, where train refuses the same file.
    out = tmp_path / "analysis"
    data = str(files["root"] / "reviews.csv")
    assert main(["analyze", "--model", str(files["model"]), "--data", data, "--out", str(out), "--no-progress",
                 "--limit", "4"]) == 0
    assert f"texts: column 'review' of {data}" in capsys.readouterr().out
    assert main(["train", "--out", str(tmp_path / "run"), "--data", data, "--set", 'data.text_column="review"',
                 "--set", "train.epochs=1", "--set", "model.d_model=16", "--set", "model.num_layers=1",
                 "--set", "model.d_ff=32", "--set", "model.num_heads=2", "--quiet"]) == 0


def test_compare_checks_both_models_importance_inputs_before_analysing_either(files, tmp_path, capsys, monkeypatch):
    # Regression: model B's missing classifier was found only after model A's whole statistics pass.
    from attnlab.inspect.commands import compare_models

    bare = tmp_path / "bare-encoder"
    torch.manual_seed(0)
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    TransformerEncoder(tokenizer.vocab_size, 16, 1, 2, 32, max_len=32, pad_id=0).save_pretrained(
        bare, tokenizer=tokenizer)
    analysed = []
    real = compare_models.analyze_rows
    monkeypatch.setattr(compare_models, "analyze_rows", lambda *a, **k: analysed.append(1) or real(*a, **k))
    code, lines, err = _run(["compare", "--model", str(files["model"]), "--model", str(bare), "--data",
                             str(files["root"] / "labelled.csv"), "--out", str(tmp_path / "cmp"), "--importance"],
                            capsys)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"attnlab compare: error: model B ({bare}): --importance needs a classifier"), lines
    assert not analysed and not (tmp_path / "cmp").exists()


def test_compare_importance_refuses_models_whose_classes_are_named_differently(files, tmp_path, capsys):
    # Regression: labels were read by model A's names alone, so B's importance used A's class ids.
    swapped = tmp_path / "swapped"
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 16, 2, 2, 32, max_len=32, pad_id=tokenizer.pad_token_id)
    EncoderClassifier(encoder, 2, label_names=["pos", "neg"]).save_pretrained(swapped, tokenizer=tokenizer)
    code, lines, err = _run(["compare", "--model", str(files["model"]), "--model", str(swapped), "--data",
                             str(files["root"] / "labelled.csv"), "--out", str(tmp_path / "cmp"), "--importance"],
                            capsys)
    assert code == 2 and len(lines) == 1, err
    assert "model A names its classes ['neg', 'pos'], model B ['pos', 'neg']" in lines[0]
    assert not (tmp_path / "cmp").exists()
