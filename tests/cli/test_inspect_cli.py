"""`attnlab inspect` and `attnlab analyze`, run for real on a tiny saved model."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from attnlab import TransformerEncoder
from attnlab.cli import SUBCOMMANDS, main

VOCABULARY = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    ",",
    ".",
    "!",
    "<",
    ">",
    "/",
] + "the a movie was great bad fun and but not very plot script".split()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run directory in the agreed layout whose best checkpoint is a bare encoder."""
    directory = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = TransformerEncoder(
        len(VOCABULARY), d_model=16, num_layers=2, num_heads=2, d_ff=32, max_len=64, pad_id=0
    )
    checkpoint = directory / "checkpoints" / "best"
    checkpoint.mkdir(parents=True)
    save_file(dict(model.state_dict()), str(checkpoint / "model.safetensors"))
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "encoder", "encoder": model.config.to_dict()})
    )
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCABULARY)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_both_subcommands_are_registered():
    assert SUBCOMMANDS["inspect"][0] == "attnlab.cli.inspect"
    assert SUBCOMMANDS["analyze"][0] == "attnlab.cli.analyze"


def test_inspect_writes_pictures_and_report(run_dir, tmp_path, capsys):
    out = tmp_path / "inspect"
    code = main(
        [
            "inspect",
            "--model",
            str(run_dir),
            "--text",
            "the movie was <script> great , and fun !",
            "--out",
            str(out),
            "--layer",
            "1",
            "--head",
            "2",
        ]
    )
    assert code == 0
    names = {path.name for path in out.iterdir()}
    assert {"report.html", "model.png", "model.svg", "layer_1.png", "layer_2.svg", "head_L1_H2.png"} <= names
    printed = capsys.readouterr().out
    assert f"report: {out / 'report.html'}" in printed
    page = (out / "report.html").read_text()
    assert "the movie was &lt;script&gt; great" in page and "<script> great" not in page


def test_inspect_rows_draws_the_chosen_query_rows_over_every_key(run_dir, tmp_path, capsys):
    from attnlab import load
    from attnlab.workflows.inspect_text import write_inspection

    text = "the movie was great , and fun but the plot was bad !"
    model, tokenizer, _ = load(run_dir)
    whole = write_inspection(model, tokenizer, text, tmp_path / "whole", formats=["png"])
    out = tmp_path / "rows"
    assert main(["inspect", "--model", str(run_dir), "--text", text, "--out", str(out), "--rows", "last:3",
                 "--format", "png"]) == 0
    T = len(whole.tokens)
    page = (out / "report.html").read_text()
    assert f"3 of {T} query rows ({T - 3}-{T - 1})" in page and f"{T - 1}: [SEP]" in page
    assert {"report.html", "model.png", "layer_2.png", "head_L2_H1.png"} <= {path.name for path in out.iterdir()}
    rows = write_inspection(model, tokenizer, text, tmp_path / "again", formats=["png"], rows=[0, 5, 6])
    for name, weights in whole.attentions.items():
        assert torch.allclose(rows.attentions[name], weights[:, [0, 5, 6]], atol=1e-6)
    capsys.readouterr()
    for spec, message in (("abc", "--rows must be last:K, START:STOP or positions"),
                          ("0,99", "position 99 is outside this call's")):
        with pytest.raises(SystemExit) if spec == "abc" else contextlib.nullcontext():
            code = main(["inspect", "--model", str(run_dir), "--text", text, "--out", str(tmp_path / "bad"),
                         "--rows", spec])
            assert code != 0
        assert message in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_analyze_writes_json_plots_and_summary(run_dir, tmp_path, capsys):
    data = tmp_path / "reviews.csv"
    data.write_text(
        "text,label\n"
        + "".join(
            f'"the movie was {w} , very {w} !",{i % 2}\n' for i, w in enumerate(["great", "bad", "fun"] * 7)
        )
    )
    out = tmp_path / "analyze"
    code = main(
        [
            "analyze",
            "--model",
            str(run_dir),
            "--data",
            str(data),
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--mask-heads",
            "2:2",
            "--sparsity-threshold",
            "0.2",
        ]
    )
    assert code == 0
    stats = json.loads((out / "statistics.json").read_text())
    assert stats["examples"] == 21 and stats["layers"] == ["layer_1", "layer_2"]
    assert stats["settings"]["sparsity_threshold"] == 0.2
    assert stats["settings"]["head_mask"] == {"layer_2": ["head_2"]}
    assert set(stats["statistics"]) >= {"entropy", "alignment_score", "mass_cls", "mass_sep", "mass_punct"}
    assert (out / "plots" / "entropy.png").is_file() and (out / "summary.html").is_file()
    printed = capsys.readouterr()
    assert "summary:" in printed.out
    assert "analyze" in printed.err  # the progress bar


def test_bad_model_and_data_are_reported(run_dir, tmp_path, capsys):
    code = main(
        ["inspect", "--model", str(tmp_path / "nowhere"), "--text", "x", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    code = main(
        [
            "analyze",
            "--model",
            str(run_dir),
            "--data",
            str(tmp_path / "missing.txt"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2
    errors = capsys.readouterr().err
    assert "nowhere" in errors and "missing.txt" in errors


def test_console_entry_runs_in_a_fresh_process(run_dir, tmp_path):
    source = Path(__file__).resolve().parents[2] / "src"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnlab.cli",
            "inspect",
            "--model",
            str(run_dir),
            "--text",
            "a bad plot .",
            "--out",
            str(tmp_path / "o"),
            "--format",
            "png",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "o" / "report.html").is_file()


def test_checkpoint_dir_window_and_importance_needs_a_classifier(run_dir, tmp_path, capsys):
    out = tmp_path / "inspect"
    code = main(
        [
            "inspect",
            "--model",
            str(run_dir / "checkpoints" / "best"),
            "--text",
            "a very bad plot .",
            "--out",
            str(out),
            "--format",
            "svg",
            "--window",
            "1:4",
        ]
    )
    assert code == 0 and (out / "head_L2_H1.svg").is_file() and not (out / "model.png").exists()
    data = tmp_path / "texts.txt"
    data.write_text("a bad plot .\nthe movie was fun !\n")
    code = main(
        [
            "analyze",
            "--model",
            str(run_dir),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "a"),
            "--importance",
            "--no-progress",
        ]
    )
    assert code == 2
    assert "needs a classifier" in capsys.readouterr().err  # checked before the labels


def test_mask_heads_flag_counts_from_1_and_refuses_0():
    import argparse

    from attnlab.inspect.commands.analyze_command import _heads

    assert _heads("2:1,4") == ("layer_2", [0, 3])
    assert _heads("layer_2:1") == ("layer_2", [0])
    for bad in ("2:0", "0:1", "layer_2", "2:x"):
        with pytest.raises(argparse.ArgumentTypeError, match="numbered from 1"):
            _heads(bad)
