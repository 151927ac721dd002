import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.checkpoints import load_model

TINY_CONFIG = """
[model]
d_model = 16
num_layers = 1
num_heads = 2
d_ff = 32

[data]
vocab_size = 60
min_frequency = 1
max_length = 16

[train]
epochs = 2
batch_size = 8
warmup_steps = 2
learning_rate = 3e-3
log_every = 1
eval_batch_size = 32
num_threads = 1
"""


@pytest.fixture
def tiny_csv(tmp_path):
    rng = random.Random(0)
    good, bad = ["great", "fine", "lovely", "superb"], ["awful", "dull", "boring", "poor"]
    rows = ["text,label"]
    for index in range(80):
        label = index % 2
        words = rng.sample(good if label else bad, 2) + rng.sample(["film", "plot", "cast", "story"], 2)
        rng.shuffle(words)
        rows.append(f"{' '.join(words)},{'pos' if label else 'neg'}")
    path = tmp_path / "reviews.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TINY_CONFIG)
    return path


def test_train_writes_the_agreed_run_directory(tmp_path, tiny_csv, tiny_config, capsys):
    out = tmp_path / "run"
    code = main(["train", "--config", str(tiny_config), "--data", str(tiny_csv), "--out", str(out), "--quiet",
                 "--set", "train.epochs=3"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and str(out) in printed
    for name in ("config.json", "tokenizer.json", "metrics.jsonl", "test_report.json"):
        assert (out / name).is_file(), name
    for checkpoint in ("best", "last"):
        for name in ("model.safetensors", "config.json", "trainer_state.pt"):
            assert (out / "checkpoints" / checkpoint / name).is_file()
    resolved = json.loads((out / "config.json").read_text())
    assert resolved["train"]["epochs"] == 3 and resolved["data"]["path"] == str(tiny_csv)
    report = json.loads((out / "test_report.json").read_text())
    assert report["label_names"] == ["neg", "pos"] and 0.0 <= report["test"]["accuracy"] <= 1.0
    saved = json.loads((out / "checkpoints" / "best" / "config.json").read_text())
    assert saved["model_type"] == "encoder_classifier" and saved["head"]["label_names"] == ["neg", "pos"]

    loaded = load_model(out)
    ids = torch.tensor([loaded.tokenizer.encode("great lovely film").ids])
    output = loaded.model(ids, output_attentions=True)
    assert output.logits.shape == (1, 2) and output.attentions["layer_1"].shape[:2] == (1, 2)

    # resuming a finished run changes nothing and succeeds
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    assert json.loads((out / "test_report.json").read_text())["test"] == report["test"]


def test_existing_run_directory_needs_resume(tmp_path, tiny_csv, tiny_config, capsys):
    out = tmp_path / "run"
    args = ["train", "--config", str(tiny_config), "--data", str(tiny_csv), "--out", str(out), "--quiet",
            "--set", "train.epochs=1"]
    assert main(args) == 0
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--resume", "--set", "train.epochs=2"]) == 2


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path, tiny_csv, tiny_config, caplog):
    out = tmp_path / "run"
    assert main(["train", "--config", str(tiny_config), "--data", str(tiny_csv), "--out", str(out), "--quiet",
                 "--set", "train.epochs=1"]) == 0
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert main(["train", "--out", str(out), "--resume", "--quiet"]) == 0
    assert "already finished" in caplog.text
    after = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    assert after == before


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"review,label\nfine,pos\n", "no column 'text'"),
    (b"text,label\ncaf\xe9,pos\n", "not valid UTF-8"),
    (b"text,label\na,pos\nb,neg\nc,meh\n", "unknown labels"),
])
def test_bad_data_files_fail_clearly(tmp_path, tiny_config, capsys, content, message):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    args = ["train", "--config", str(tiny_config), "--data", str(path), "--out", str(tmp_path / "run"), "--quiet"]
    if message == "unknown labels":
        args += ["--set", 'data.labels=["neg", "pos"]']
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: error:") and message in err and "bad.csv" in err


def test_bad_settings_fail_clearly(tmp_path, tiny_config, capsys):
    assert main(["train", "--config", str(tiny_config), "--out", str(tmp_path / "r"), "--set", "train.epochs=zero"]) == 2
    assert "train.epochs must be int" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "r")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_exit_code_of_the_real_command(tmp_path, tiny_config):
    missing = tmp_path / "missing.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "attnlab.cli", "train", "--config", str(tiny_config),
                             "--data", str(missing), "--out", str(tmp_path / "run")],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "missing.jsonl does not exist" in result.stderr


def test_masked_lm_pretraining_phase(tmp_path, tiny_csv, tiny_config):
    out = tmp_path / "run"
    assert main(["train", "--config", str(tiny_config), "--data", str(tiny_csv), "--out", str(out), "--quiet",
                 "--set", "train.epochs=1", "--set", "train.mlm_steps=4"]) == 0
    assert (out / "pretrain" / "checkpoints" / "last" / "model.safetensors").is_file()
    pretrain = [json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in pretrain] == [1, 2, 3, 4]
    assert load_model(out / "pretrain" / "checkpoints" / "last").config["model_type"] == "encoder_masked_lm"
    assert (out / "test_report.json").is_file()


def test_a_second_run_into_a_run_directory_in_use_is_refused_naming_the_first(tmp_path, tiny_csv, tiny_config):
    """Two runs into one --out both exited 0, and the folder ended with a mix of both (the
    second's config.json and report, both runs' steps in metrics.jsonl). The first holds the
    folder; the second, plain, --overwrite or --resume, is refused and touches nothing."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "attnlab.cli", "train", "--config", str(tiny_config), "--data", str(tiny_csv),
               "--out", str(out), "--quiet", "--set", "train.epochs=200"]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # until the first has started writing
            if (out / "metrics.jsonl").is_file() or first.poll() is not None:
                break
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()
        before = (out / "config.json").read_text()
        for extra in ([], ["--overwrite"]):
            second = subprocess.run(command + extra, capture_output=True, text=True, timeout=300)
            lines = [line for line in second.stderr.splitlines() if line.strip()]
            assert second.returncode == 2 and len(lines) == 1, second.stderr
            assert f"is in use by another attnlab run (process {first.pid})" in lines[0]
        resumed = subprocess.run([sys.executable, "-m", "attnlab.cli", "train", "--out", str(out), "--resume"],
                                 capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 2 and f"process {first.pid}" in resumed.stderr
        assert (out / "config.json").read_text() == before
    finally:
        first.terminate()
        first.communicate(timeout=120)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records if record["split"] == "train"]
    assert len(steps) == len(set(steps))  # one run's steps only
    assert list(out.glob("tensorboard/*")) == [] or len(list((out / "tensorboard").iterdir())) == 1
    from attnlab.train.run_dir import hold_run_dir, release_run_dir

    hold_run_dir(out)  # the lock went with the first process: the folder is free again
    release_run_dir(out)
