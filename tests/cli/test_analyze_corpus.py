"""`attnlab analyze` past one process and safe to stop: torchrun shards merged exactly (gloo on
this machine), and a run killed then started again ends with the same bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch


from attnlab import TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer
from attnlab.models.classifier import EncoderClassifier

WORDS = "a fine film dull and long great fun not very good the plot is thin acting was bad".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """A tiny classifier directory and 23 labelled texts of uneven lengths (uneven shards, padded batches)."""
    root = tmp_path_factory.mktemp("corpus")
    texts = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(2 + (i * 5) % 9)) for i in range(23)]
    tokenizer = Tokenizer(train_tokenizer(texts, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 16, 2, 2, 32, max_len=32, pad_id=tokenizer.pad_token_id)
    model = root / "model"
    EncoderClassifier(encoder, 2, label_names=["neg", "pos"]).save_pretrained(model, tokenizer=tokenizer)
    data = root / "texts.csv"
    data.write_text("text,label\n" + "".join(f"{text},{['neg', 'pos'][i % 2]}\n" for i, text in enumerate(texts)))
    return {"model": model, "data": data}


def _command(corpus, out: Path, *extra: str) -> list[str]:
    return ["analyze", "--model", str(corpus["model"]), "--data", str(corpus["data"]), "--out", str(out),
            "--batch-size", "2", "--importance", "--no-progress", *extra]


def _run(arguments: list[str], processes: int = 1, **options) -> subprocess.CompletedProcess:
    if processes == 1:
        command = [sys.executable, "-m", "attnlab.cli", *arguments]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "-m", "attnlab.cli", *arguments]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600, **options)


def _flat(statistics: dict) -> dict[str, float]:
    """Every number of statistics.json by its place (``None`` kept apart)."""
    flat = {}

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}/{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{where}/{index}")
        elif isinstance(value, (int, float)) or value is None:
            flat[where] = value

    walk({key: statistics[key] for key in ("statistics", "rows", "rollout", "examples", "tokens",
                                           "head_importance")}, "")
    return flat


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "analysis"
    result = _run(_command(corpus, out))
    assert result.returncode == 0, result.stderr
    assert not (out / ".analysis-partial").exists()  # the checkpoints go once the result is written
    return out / "statistics.json"


@pytest.mark.parametrize("processes", [2, 3])
def test_torchrun_shards_add_up_to_the_one_process_result(corpus, one_process, tmp_path, processes):
    out = tmp_path / "analysis"
    result = _run(_command(corpus, out), processes=processes)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("statistics:") == 1  # process 0 alone reports and writes
    assert not (out / ".analysis-partial").exists()
    want, got = _flat(json.loads(one_process.read_text())), _flat(json.loads((out / "statistics.json").read_text()))
    assert got.keys() == want.keys() and got["/examples"] == 23
    for where, value in want.items():
        if value is None:
            assert got[where] is None, where
        else:
            assert got[where] == pytest.approx(value, rel=1e-6, abs=1e-9), where


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_a_run_stopped_and_started_again_ends_with_the_same_bytes(corpus, one_process, tmp_path, how):
    out = tmp_path / "analysis"
    command = [sys.executable, "-m", "attnlab.cli", *_command(corpus, out, "--checkpoint-seconds", "0")]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    partial = out / ".analysis-partial" / "rank0-of-1.pt"
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    deadline = time.monotonic() + 300
    while not partial.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before its first checkpoint: nothing to interrupt"
    process.send_signal(getattr(signal, how))
    _, stderr = process.communicate(timeout=300)
    if how == "SIGTERM":  # a clean stop: the batch in hand, a checkpoint, one line, 128 + 15
        assert process.returncode == 143, stderr
        assert "stopped by SIGTERM" in stderr and "run the same command again to resume" in stderr
        assert "Traceback" not in stderr
    else:
        assert process.returncode == -signal.SIGKILL
    assert partial.exists() and not (out / "statistics.json").exists()
    resumed = _run(_command(corpus, out, "--checkpoint-seconds", "0"))
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "statistics.json").read_bytes() == one_process.read_bytes()
    assert not (out / ".analysis-partial").exists()


def test_a_checkpoint_of_other_settings_is_refused_not_mixed_in(corpus, tmp_path):
    out = tmp_path / "analysis"
    partial = out / ".analysis-partial"
    partial.mkdir(parents=True)
    torch.save({"key": "another analysis", "statistics": {}}, partial / "rank0-of-1.pt")
    result = _run(_command(corpus, out))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"attnlab analyze: error: {partial} holds a partial "
                                                             f"analysis of other data, settings or model")
    assert not (out / "statistics.json").exists() and (partial / "rank0-of-1.pt").exists()
    torch.save({"key": "x"}, partial / "rank0-of-1.pt")
    (partial / "rank0-of-1.pt").rename(partial / "rank1-of-2.pt")
    result = _run(_command(corpus, out))
    assert result.returncode == 2 and "run with another number of processes (rank1-of-2.pt)" in result.stderr
