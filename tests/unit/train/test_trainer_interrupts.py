"""Runs never lose work: signals, periodic saves, resume, non-finite losses, progress lines."""

import io
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attnlab.data import PaddingCollator
from attnlab.train import NonFiniteLossError, ProgressBar, TrainingInterrupted, TransformerTrainer
from attnlab.train import saving
from attnlab.train import trainer as trainer_module

import tiny_run

COLLATE = PaddingCollator(0)
TINY_RUN = Path(__file__).with_name("tiny_run.py")


def _trainer(model, out, **options):
    return TransformerTrainer(model, 3e-3, 3, weight_decay=0.01, output_dir=out, quiet=True, **options)


def _fit(trainer, dataset, **options):
    options = {"collate_fn": COLLATE, "batch_size": 8, "epochs": None, "max_steps": 12, **options}
    return trainer.fit(dataset, **options)


def _records(run_dir):
    return (run_dir / "metrics.jsonl").read_text()


def _step_of(checkpoint):
    return torch.load(checkpoint / "trainer_state.pt", weights_only=True)["trainer"]["step"]


@pytest.mark.parametrize("signal_number, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_finishes_the_step_saves_and_resumes_exactly(tmp_path, dataset, make_model, signal_number,
                                                               code):
    reference = _trainer(make_model(0.1), tmp_path / "full")
    _fit(reference, dataset, eval_data=dataset, eval_every=4)
    before = signal.getsignal(signal_number)
    trainer = _trainer(make_model(0.1), tmp_path / "cut")
    trainer.add_callback("on_step_end", lambda t: t.state.step == 6 and os.kill(os.getpid(), signal_number))
    with pytest.raises(TrainingInterrupted) as stopped:
        _fit(trainer, dataset, eval_data=dataset, eval_every=4)
    assert stopped.value.exit_code == code and stopped.value.step == 6
    assert stopped.value.checkpoint == tmp_path / "cut" / "checkpoints" / "last"
    assert "resumable checkpoint" in str(stopped.value) and "\n" not in str(stopped.value)
    assert _step_of(stopped.value.checkpoint) == 6
    assert signal.getsignal(signal_number) is before  # handlers restored in finally
    torch.manual_seed(99)  # a resumed run does not depend on the RNG state it starts with
    resumed = _trainer(make_model(0.1), tmp_path / "cut")
    _fit(resumed, dataset, eval_data=dataset, eval_every=4, resume_from=True)
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    for (name, a), b in zip(reference.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name


def test_no_handlers_outside_the_main_thread(tmp_path, dataset, make_model):
    errors = []

    def train():
        try:
            _fit(_trainer(make_model(0.0), tmp_path), dataset, max_steps=2)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert errors == []


def test_resuming_a_finished_run_changes_nothing(tmp_path, dataset, make_model, caplog):
    _fit(_trainer(make_model(0.1), tmp_path), dataset, eval_data=dataset, eval_every=4)
    files = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with caplog.at_level(logging.INFO, logger="attnlab.train.trainer"):
        state = _fit(_trainer(make_model(0.1), tmp_path), dataset, eval_data=dataset, eval_every=4,
                     resume_from=True)
    assert state.step == 12 and "already finished at step 12" in caplog.text
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == files


def test_an_early_stopped_run_stays_stopped(tmp_path, dataset, make_model):
    trainer = _trainer(make_model(0.1), tmp_path)
    _fit(trainer, dataset, eval_data=dataset, eval_every=1, metric="loss", early_stopping_patience=1,
         max_steps=40)
    assert trainer.state.should_stop and trainer.state.step < 40
    again = _fit(_trainer(make_model(0.1), tmp_path), dataset, eval_data=dataset, eval_every=1, metric="loss",
                 early_stopping_patience=1, max_steps=40, resume_from=True)
    assert again.step == trainer.state.step


def test_replayed_steps_never_overwrite_a_better_best_checkpoint(tmp_path, dataset, make_model, monkeypatch):
    reference = _trainer(make_model(0.1), tmp_path / "full")
    _fit(reference, dataset, eval_data=dataset, eval_every=1, max_steps=10)
    best_step = reference.state.best_step
    assert best_step > 2
    trainer = _trainer(make_model(0.1), tmp_path / "cut")

    def die(t):
        if t.state.step == best_step:
            raise KeyboardInterrupt  # a kill after best was written, long after the last checkpoint

    trainer.add_callback("on_step_end", lambda t: None)
    trainer.add_callback("on_save", lambda t: t.state.step == best_step and die(t))
    with pytest.raises(KeyboardInterrupt):
        _fit(trainer, dataset, eval_data=dataset, eval_every=1, max_steps=10, save_every=2)
    best = tmp_path / "cut" / "checkpoints" / "best"
    assert _step_of(best) == best_step and _step_of(tmp_path / "cut" / "checkpoints" / "last") < best_step
    saved = []
    monkeypatch.setattr(TransformerTrainer, "save_checkpoint",
                        lambda self, directory, keep=1: saved.append((Path(directory).name, self.state.step)))
    _fit(_trainer(make_model(0.1), tmp_path / "cut"), dataset, eval_data=dataset, eval_every=1, max_steps=10,
         save_every=2, resume_from=True)
    assert not [step for name, step in saved if name == "best" and step <= best_step]
    assert _step_of(best) == best_step


def test_non_finite_loss_stops_before_the_update(tmp_path, dataset, make_model):
    model = make_model(0.0)
    trainer = _trainer(model, tmp_path)

    def poison(t):
        if t.state.step == 3:
            model.classifier.weight.data.fill_(float("nan"))

    trainer.add_callback("on_step_end", poison)
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at step 4") as error:
        _fit(trainer, dataset)
    assert isinstance(error.value, ValueError) and trainer.state.step == 3
    for line in _records(tmp_path).splitlines():
        json.loads(line, parse_constant=pytest.fail)


def test_periodic_saves_follow_training_time(tmp_path, dataset, make_model, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(trainer_module.time, "monotonic", lambda: now[0])
    trainer = _trainer(make_model(0.0), tmp_path)
    trainer.add_callback("on_step_end", lambda t: now.__setitem__(0, now[0] + 25.0))  # 25 s per step
    _fit(trainer, dataset, max_steps=7, save_every_minutes=1.0)
    checkpoints = tmp_path / "checkpoints"
    steps = [_step_of(checkpoints / name) for name in ("last", "last.1", "last.2")]
    assert steps == [7, 6, 3]  # at 75 s, 75 s later, and at the end


def test_saves_wait_fifty_times_their_own_duration():
    schedule = saving.SaveSchedule(None, 0.01)
    schedule.saved(0.0, 10.0)  # one save took 10 s
    schedule.last_end = time.monotonic() - 400.0
    assert not schedule.due(1)  # 0.6 s interval, but 50 x 10 s = 500 s have not passed
    schedule.last_end = time.monotonic() - 501.0
    assert schedule.due(2)


def test_progress_goes_to_log_lines_without_a_terminal(tmp_path, dataset, make_model, caplog):
    now = [0.0]
    bar = ProgressBar(stream=io.StringIO(), log_seconds=30.0, clock=lambda: now[0])
    trainer = TransformerTrainer(make_model(0.0), 3e-3, 3, callbacks=[bar], quiet=True)  # no second bar
    trainer.add_callback("on_step_end", lambda t: now.__setitem__(0, now[0] + 10.0))  # runs after the bar
    with caplog.at_level(logging.INFO, logger="attnlab.train.callbacks"):
        _fit(trainer, dataset, max_steps=10)
    lines = [record.getMessage() for record in caplog.records if record.name == "attnlab.train.callbacks"]
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert "steps/s" in lines[1] and "left" in lines[1]
    assert bar.stream.getvalue() == ""  # no tqdm bar into a file


def _env():
    src = str(Path(__file__).parents[3] / "src")
    path = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _start(out, *extra):
    log = open(out.parent / f"{out.name}.log", "ab")
    command = [sys.executable, str(TINY_RUN), "--out", str(out), "--losses", "--eval-every", "5", *extra]
    return subprocess.Popen(command, env=_env(), stdout=log, stderr=log), log


def _stop_after(process, out, steps, signal_number):
    """Send ``signal_number`` once ``metrics.jsonl`` holds ``steps`` training records."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and sum('"train"' in line for line in metrics.read_text().splitlines()) >= steps:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be stopped"
    process.send_signal(signal_number)
    return process.wait(timeout=60)


@pytest.mark.slow
def test_sigint_sigterm_and_sigkill_at_random_points_then_resume_bit_for_bit(tmp_path):
    seed = random.randrange(10**6)
    points = sorted(random.Random(seed).sample(range(3, 27), 3))  # three stops, in order, inside 30 steps
    run = tmp_path / "stopped"
    for index, (signal_number, code) in enumerate([(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                                   (signal.SIGKILL, -signal.SIGKILL)]):
        process, log = _start(run, "--sleep", "0.05", *(["--resume"] if index else []))
        with log:
            assert _stop_after(process, run, points[index], signal_number) == code, (seed, points)
    text = (tmp_path / "stopped.log").read_text()
    assert text.count("resumable checkpoint written to") == 2, text[-2000:]
    finished, log = _start(run, "--resume")
    with log:
        assert finished.wait(timeout=120) == 0, (tmp_path / "stopped.log").read_text()[-2000:]
    tiny_run.main(["--out", str(tmp_path / "full"), "--losses", "--eval-every", "5"])  # uninterrupted, here
    assert _records(run) == _records(tmp_path / "full"), (seed, points)  # the whole history, byte for byte
    resumed = torch.load(run / "params.pt", weights_only=True)
    full = torch.load(tmp_path / "full" / "params.pt", weights_only=True)
    assert all(torch.equal(resumed[name], full[name]) for name in full), (seed, points)
    assert _step_of(run / "checkpoints" / "best") == _step_of(tmp_path / "full" / "checkpoints" / "best")


@pytest.mark.parametrize("error, code, line", [
    (TrainingInterrupted(signal.SIGINT, 7, Path("my run/checkpoints/last")), 130,
     "stopped by SIGINT after step 7; resumable checkpoint written to my run/checkpoints/last; "
     "continue with: attnlab train --out 'my run' --resume"),
    (TrainingInterrupted(signal.SIGTERM, 7, Path("r/checkpoints/last")), 143,
     "stopped by SIGTERM after step 7"),
    (NonFiniteLossError(5, "training loss", float("inf"), 1e-3), 2,
     "error: the training loss is inf at step 5"),
])
def test_the_command_prints_one_line_and_exits_with_the_status(monkeypatch, capsys, error, code, line):
    import attnlab.train.command as command
    from attnlab.cli import main

    def stop(args):
        raise error

    monkeypatch.setattr(command, "run", stop)
    assert main(["train", "--out", "my run" if code == 130 else "r"]) == code
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and line in printed


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_exactly(tmp_path, dataset, make_model, caplog):
    reference = _trainer(make_model(0.1), tmp_path / "full")
    _fit(reference, dataset)
    trainer = _trainer(make_model(0.1), tmp_path / "cut")

    def die(t):
        if t.state.step == 7:
            raise KeyboardInterrupt  # as a kill: checkpoints at steps 6, 4 and 2 remain

    trainer.add_callback("on_step_end", die)
    with pytest.raises(KeyboardInterrupt):
        _fit(trainer, dataset, save_every=2)
    weights = tmp_path / "cut" / "checkpoints" / "last" / "model.safetensors"
    os.truncate(weights, 1000)
    resumed = _trainer(make_model(0.1), tmp_path / "cut")
    with caplog.at_level(logging.WARNING):
        _fit(resumed, dataset, save_every=2, resume_from=True)
    assert "model.safetensors" in caplog.text and "step 4" in caplog.text
    assert _records(tmp_path / "cut") == _records(tmp_path / "full")
    for (name, a), b in zip(reference.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name
