import json
import os

import pytest
import torch

from attnlab.data import PaddingCollator
from attnlab.train import TransformerTrainer, save_checkpoint
from attnlab.train import checkpoint as checkpoint_module

COLLATE = PaddingCollator(0)


def fit_recording(model, dataset, output_dir, *, stop_at=None, resume_from=None):
    losses = {}
    trainer = TransformerTrainer(model, 3e-3, 3, weight_decay=0.01, output_dir=output_dir, quiet=True)

    def record(t):
        losses[t.state.step] = t.last_log["loss"]
        if stop_at is not None and t.state.step == stop_at:
            raise KeyboardInterrupt  # dies mid-run, after checkpoint of step stop_at - 1

    trainer.add_callback("on_step_end", record)
    try:
        trainer.fit(dataset, collate_fn=COLLATE, batch_size=5, epochs=3, save_every=3, resume_from=resume_from)
    except KeyboardInterrupt:
        pass
    return losses, trainer


def test_resume_is_exact_bit_for_bit(tmp_path, dataset, make_model):
    full, reference = fit_recording(make_model(0.2), dataset, tmp_path / "full")
    assert len(full) == 30  # 48 items / 5 -> 10 batches per epoch, 3 epochs; crosses epoch ends
    interrupted, _ = fit_recording(make_model(0.2), dataset, tmp_path / "cut", stop_at=14)
    assert max(interrupted) == 14
    torch.manual_seed(1234)  # a resumed run must not depend on the RNG state it starts with
    resumed, trainer = fit_recording(make_model(0.2), dataset, tmp_path / "cut",
                                     resume_from=tmp_path / "cut" / "checkpoints" / "last")
    assert min(resumed) == 13 and max(resumed) == 30
    for step in range(13, 31):
        assert resumed[step] == full[step], f"step {step}: {resumed[step]!r} != {full[step]!r}"
    for (name, a), b in zip(reference.model.named_parameters(), trainer.model.parameters()):
        assert torch.equal(a, b), name
    logged = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in logged] == list(range(1, 31))  # replayed steps are not duplicated


def test_trainer_state_loads_with_weights_only(tmp_path, dataset, make_model):
    fit_recording(make_model(0.1), dataset, tmp_path, stop_at=4)
    state = torch.load(tmp_path / "checkpoints" / "last" / "trainer_state.pt", weights_only=True)
    assert state["trainer"]["step"] == 3 and state["trainer"]["batch_in_epoch"] == 3
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert {"optimizer", "scheduler"} <= set(state)


def test_atomic_save_survives_an_exception_mid_write(tmp_path, make_model, monkeypatch):
    target = tmp_path / "checkpoints" / "last"
    save_checkpoint(target, make_model(0.0), {"step": 1})
    before = {path.name: path.read_bytes() for path in target.iterdir()}

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash)  # after the weights were written
    changed = make_model(0.0)
    with torch.no_grad():
        next(changed.parameters()).add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, changed, {"step": 2})
    assert {path.name: path.read_bytes() for path in target.iterdir()} == before
    assert sorted(path.name for path in target.parent.iterdir()) == ["last"]  # no temporary left


def test_crash_between_the_two_renames_is_recovered(tmp_path, make_model):
    target = tmp_path / "last"
    save_checkpoint(target, make_model(0.0), {"step": 1})
    os.replace(target, tmp_path / "last.old")  # the state right after the first rename
    (tmp_path / ".last.tmp-dead").mkdir()  # and a half-written new one
    state = checkpoint_module.load_trainer_state(target)
    assert state["step"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["last"]
