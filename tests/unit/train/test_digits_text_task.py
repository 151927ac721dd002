"""The digits-text task through `attnlab train`: run directory, gate telemetry, task defaults."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.checkpoints import load_model
from attnlab.models.image_text import ImageTextModel
from attnlab.train.run_config import RunConfig, resolve_run_config
from attnlab.train.tasks import Task, get_task, register_task, task_names

_SETTINGS = (
    "task=digits-text", "train.max_steps=4", "train.eval_every=2", "train.log_every=1", "warmup_steps=1",
    "train_limit=32", "d_model=16", "visual_dim=16", "d_ff=32", "visual_layers=1", "cross_layers=1",
    "num_heads=2", "statements_per_image=2", "data.validation_fraction=0.02", "data.test_fraction=0.02",
    'gate="tanh0"',
)
TINY = [argument for setting in _SETTINGS for argument in ("--set", setting)]


def test_the_task_trains_and_writes_the_agreed_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--quiet", *TINY]) == 0
    assert "test accuracy" in capsys.readouterr().out
    for name in ("config.json", "tokenizer.json", "metrics.jsonl", "test_report.json"):
        assert (out / name).is_file()
    report = json.loads((out / "test_report.json").read_text())
    assert report["task"] == "digits-text" and 0.0 <= report["test"]["accuracy"] <= 1.0
    train_logs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["split"] == "train"]
    assert train_logs and all("gate/layer_1" in record for record in train_logs)
    assert train_logs[0]["gate/layer_1"] == 0.0  # tanh0: the block starts as the identity
    assert train_logs[-1]["gate/layer_1"] != 0.0  # and its gate opens as it learns
    loaded = load_model(out)
    assert isinstance(loaded.model, ImageTextModel) and loaded.model.config.gate == "tanh0"
    ids = torch.tensor([loaded.tokenizer.encode("this is a seven").ids])
    assert loaded.model(ids, images=torch.rand(1, 8, 8)).logits.shape == (1, 2)


def test_task_defaults_sit_under_the_users_settings(tmp_path):
    config = resolve_run_config(None, ["task=digits-text", "train.epochs=3"])
    assert config.data.task == "digits-text"
    assert config.train.batch_size == 16 and config.model.d_model == 64  # the task's defaults
    assert config.train.epochs == 3  # the user's setting wins
    toml = tmp_path / "run.toml"
    toml.write_text('[data]\ntask = "digits-text"\n[model]\nd_model = 32\n')
    from_file = resolve_run_config(toml, [])
    assert from_file.model.d_model == 32 and from_file.train.learning_rate == pytest.approx(2e-3)
    assert resolve_run_config(None, []) == RunConfig()  # text classification keeps its defaults


def test_unknown_task_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match="digits-text"):
        resolve_run_config(None, ["task=images"])
    with pytest.raises(ValueError, match="unknown task"):
        get_task("images")


def test_tasks_register_once():
    assert {"text-classification", "digits-text"} <= set(task_names())
    with pytest.raises(ValueError, match="already registered"):
        register_task(Task("digits-text", "again", run=lambda *a, **k: None))


def test_image_attention_command_draws_pngs_and_scores_alignment(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--quiet", *TINY]) == 0
    pictures = tmp_path / "pictures"
    assert main(["image-attention", "--run", str(out), "--out", str(pictures), "--examples", "2"]) == 0
    assert "attention mass on inked patches" in capsys.readouterr().out
    alignment = json.loads((pictures / "alignment.json").read_text())
    assert set(alignment) == {"layer_1"} and 0.0 <= alignment["layer_1"]["mass"] <= 1.0
    assert len(alignment["layer_1"]["heads"]["alignment_score"]) == 2  # one per head
    assert len(list(pictures.glob("*.png"))) == 2
    page = (pictures / "report.html").read_text()
    assert "alignment_score" in page and "data:image/png;base64" in page
    # Regression: the tables' reference read "previous/next token"; here it is the inked patches
    assert "previous/next token" not in page and "on inked patches (the reference)" in page
