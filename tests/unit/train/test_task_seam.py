"""The seam between ``attnlab train`` and its tasks: registry, own settings, shared ending."""

from __future__ import annotations

import copy
import json
import pickle
from types import SimpleNamespace

import pytest
import torch

from attnlab.train import run_steps
from attnlab.train.run_config import RunConfig, resolve_run_config
from attnlab.train.tasks import TASKS, get_task
from attnlab.train.tasks.digits_text import ImageSettings


def test_every_registered_task_lives_in_its_own_module():
    for name, (module, description) in ((n, e) for n, e in TASKS.items() if isinstance(e, tuple)):
        task = get_task(name)
        assert task.name == name and task.description == description
        assert task.run.__module__ == module


@pytest.mark.parametrize("setting", [
    'model.position="rotary"', "model.pretrained=minilm", "data.path=reviews.csv", "data.vocab_size=100",
    "train.mlm_steps=10", "classifier_dropout=0.2",
])
def test_a_setting_the_digits_task_does_not_read_is_refused(setting):
    key = setting.split("=")[0]
    with pytest.raises(ValueError, match=rf"{key.split('.')[-1]}.*not used by task 'digits-text'"):
        resolve_run_config(None, ["task=digits-text", setting])


def test_the_text_task_refuses_the_image_section(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config section 'image'"):
        resolve_run_config(None, ["image.visual_dim=8"])
    toml = tmp_path / "run.toml"
    toml.write_text("[image]\nvisual_dim = 8\n")
    message = r"unknown config sections \['image'\]; sections of task 'text-classification'"
    with pytest.raises(ValueError, match=message):
        resolve_run_config(toml, [])
    with pytest.raises(ValueError, match=r"\[image\] is not used by task 'text-classification'"):
        RunConfig(sections={"image": ImageSettings()})


def test_a_task_section_lives_with_its_task_and_round_trips():
    config = resolve_run_config(None, ["task=digits-text", "visual_dim=16"])
    assert isinstance(config.image, ImageSettings) and config.image.visual_dim == 16
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert "image" not in RunConfig().to_dict()
    assert copy.deepcopy(config) == config and pickle.loads(pickle.dumps(config)).image == config.image
    with pytest.raises(AttributeError, match="image"):
        RunConfig().image


def test_finish_run_waits_for_every_process_before_reloading_the_best_checkpoint(tmp_path, monkeypatch):
    """Both tasks end through finish_run, so both wait at the barrier (the digits task did not)."""
    events = []
    monkeypatch.setattr(run_steps, "barrier", lambda: events.append("barrier"))
    monkeypatch.setattr(run_steps, "load_safetensors_into", lambda *a, **k: events.append("load"))
    best = tmp_path / "checkpoints" / "best"
    best.mkdir(parents=True)
    (best / "model.safetensors").write_bytes(b"")
    trainer = SimpleNamespace(model=torch.nn.Linear(1, 1), device=torch.device("cpu"), metrics_logger=None,
                              evaluate=lambda *a, **k: events.append("test") or {"accuracy": 1.0})
    state = SimpleNamespace(best_step=3, best_metric=0.5, step=4)
    result = run_steps.finish_run(trainer, state, RunConfig(), tmp_path, [], collate_fn=None,
                                  report={"task": "x"})
    assert events == ["barrier", "load", "test"]
    assert result.report["checkpoint"] == "checkpoints/best" and result.report["task"] == "x"
    assert json.loads((tmp_path / "test_report.json").read_text()) == result.report
    for name in ("text-classification", "digits-text"):
        module = __import__(TASKS[name][0], fromlist=["finish_run"])
        assert module.finish_run is run_steps.finish_run


def test_a_saved_run_with_another_tasks_default_section_still_resumes(tmp_path):
    """config.json of runs written before tasks owned their sections holds [image] at its defaults."""
    values = RunConfig().to_dict()
    values["image"] = json.loads(json.dumps(ImageSettings().__dict__))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    assert RunConfig.from_json(path) == RunConfig()
    values["image"]["visual_dim"] = 8  # a real setting the task does not read: refused
    path.write_text(json.dumps(values))
    with pytest.raises(ValueError, match="image"):
        RunConfig.from_json(path)
