"""Checkpoints on disk: rotation, checks on load, damaged files, permissions, strict JSON."""

import json
import logging
import os
import stat

import pytest
import torch

from attnlab._files import CorruptFileError, json_dumps, read_json
from attnlab.checkpoints import load_model
from attnlab.checkpoints.encoders.loading import from_pretrained
from attnlab.train import check_checkpoint, find_resumable, save_checkpoint


def _state(step):
    return {"trainer": {"step": step, "best_metric": float("nan")}, "total_steps": 10}


def _save_steps(target, model, steps, keep=3):
    for step in steps:
        save_checkpoint(target, model, _state(step), keep=keep)


def test_rotation_keeps_the_newest_versions(tmp_path, make_model):
    target = tmp_path / "checkpoints" / "last"
    _save_steps(target, make_model(0.0), [1, 2, 3, 4])
    names = sorted(path.name for path in target.parent.iterdir())
    assert names == ["last", "last.1", "last.2"]
    manifests = [json.loads((target.parent / name / "checkpoint.json").read_text()) for name in names]
    steps = [manifest["trainer"]["step"] for manifest in manifests]
    assert steps == [4, 3, 2]
    assert find_resumable(target).step == 4


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, make_model, caplog):
    target = tmp_path / "last"
    _save_steps(target, make_model(0.0), [1, 2, 3])
    weights = target / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with caplog.at_level(logging.WARNING):
        found = find_resumable(target)
    assert found.directory == tmp_path / "last.1" and found.step == 2
    assert "model.safetensors" in caplog.text and "bytes" in caplog.text


@pytest.mark.parametrize("damage, message", [
    (lambda d: os.truncate(d / "trainer_state.pt", 100), "trainer_state.pt"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json"),
    (lambda d: (d / "checkpoint.json").unlink() or os.truncate(d / "model.safetensors", 50),
     "model.safetensors"),
    (lambda d: (d / "checkpoint.json").unlink() or (d / "trainer_state.pt").write_bytes(b"garbage"),
     "trainer_state"),
])
def test_each_kind_of_damage_is_one_line_naming_the_file(tmp_path, make_model, damage, message):
    target = tmp_path / "last"
    save_checkpoint(target, make_model(0.0), _state(1))
    damage(target)
    with pytest.raises(CorruptFileError) as error:
        check_checkpoint(target)
    assert message in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match=message):  # no whole version left: the newest one's problem
        find_resumable(target)


def test_damaged_model_files_give_one_line_errors_on_load(tmp_path, make_model):
    save_checkpoint(tmp_path / "ckpt", make_model(0.0))
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "encoder_cl')
    with pytest.raises(CorruptFileError, match=r"config\.json: not valid JSON"):
        load_model(tmp_path / "ckpt")
    save_checkpoint(tmp_path / "ckpt", make_model(0.0))
    (tmp_path / "ckpt" / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CorruptFileError, match=r"model\.safetensors: damaged safetensors file"):
        load_model(tmp_path / "ckpt")


def test_pretrained_reader_reports_damaged_files(tmp_path):
    (tmp_path / "config.json").write_text("")
    with pytest.raises(CorruptFileError, match="empty"):
        from_pretrained(tmp_path)


def test_checkpoints_follow_the_umask(tmp_path, make_model):
    previous = os.umask(0o022)
    try:
        target = tmp_path / "last"
        _save_steps(target, make_model(0.0), [1, 2])
    finally:
        os.umask(previous)
    for directory in (target, tmp_path / "last.1"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
        for path in directory.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_written_json_is_strict(tmp_path, make_model):
    strict = json_dumps({"a": [float("nan"), {"b": float("-inf")}], "c": 1.5})
    assert strict == '{"a": [null, {"b": null}], "c": 1.5}'
    save_checkpoint(tmp_path / "last", make_model(0.0), _state(1))
    manifest = read_json(tmp_path / "last" / "checkpoint.json")  # read_json refuses NaN
    assert manifest["trainer"]["best_metric"] is None
    (tmp_path / "nan.json").write_text('{"x": NaN}')
    with pytest.raises(CorruptFileError, match="NaN"):
        read_json(tmp_path / "nan.json")


def test_a_crash_between_rotation_renames_leaves_a_resumable_version(tmp_path, make_model):
    target = tmp_path / "last"
    _save_steps(target, make_model(0.0), [1, 2])
    os.replace(target, tmp_path / "last.3")  # as if killed after moving "last" away
    assert find_resumable(target).step == 2
    _save_steps(target, make_model(0.0), [3])
    assert find_resumable(target).step == 3
    assert torch.load(target / "trainer_state.pt", weights_only=True)["trainer"]["step"] == 3


def test_load_model_finds_an_older_version_when_last_is_gone(tmp_path, make_model):
    _save_steps(tmp_path / "checkpoints" / "last", make_model(0.0), [1, 2])
    os.replace(tmp_path / "checkpoints" / "last", tmp_path / "gone")  # a save cut short mid-rotation
    assert load_model(tmp_path).model is not None
