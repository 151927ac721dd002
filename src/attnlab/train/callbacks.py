"""Callbacks on named trainer events (minGPT / Lightning style) and the built-in loggers.

A callback is any ``fn(trainer)`` registered with ``trainer.add_callback(event, fn)``,
or an object whose methods are named after events (``on_step_end(self, trainer)``).
It reads what it needs from ``trainer.state`` and ``trainer.last_log``.

Events: ``on_fit_start``, ``on_step_end``, ``on_evaluate``, ``on_save``,
``on_epoch_end``, ``on_fit_end``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .._files import json_dumps

__all__ = ["EVENTS", "MetricsLogger", "TensorBoardLogger", "ProgressBar", "tensorboard_available"]

logger = logging.getLogger(__name__)

EVENTS = ("on_fit_start", "on_step_end", "on_evaluate", "on_save", "on_epoch_end", "on_fit_end")


class MetricsLogger:
    """Appends ``trainer.last_log`` to a JSON-lines file after every logged step and evaluation.

    The file is only ever appended to, one strict-JSON object per line (NaN and
    infinities become ``null``). After a resume the steps since the checkpoint run
    again; records for a step the file already holds (per ``split``) are not written
    twice, so the history reads like one uninterrupted run's.
    """

    def __init__(self, path: Union[str, Path], *, log_every: int = 1) -> None:
        self.path = Path(path)
        self.log_every = max(1, log_every)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.logged_through: dict[str, int] = {}  # split -> the last step already in the file

    def open(self, *, resuming: bool) -> None:
        """Get ready to append: finish a line cut short by a crash (it is dropped; every
        complete record stays); when ``resuming``, note the steps already logged."""
        self.logged_through = {}
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            logger.warning("%s: dropping an incomplete last line (%d bytes) left by an interrupted write",
                           self.path, len(data) - cut)
            os.truncate(self.path, cut)
            data = data[:cut]
        records = 0
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step, split = int(record.get("step", 0)), str(record.get("split", "train"))
            except (ValueError, TypeError, AttributeError):
                logger.warning("%s: line %d is not a JSON record; left as it is", self.path, number)
                continue
            records += 1
            self.logged_through[split] = max(step, self.logged_through.get(split, step))
        if not resuming:
            if records:
                logger.warning("%s already holds %d records; this run's are appended after them",
                               self.path, records)
            self.logged_through = {}

    def write(self, record: dict[str, Any]) -> None:
        step, split = record.get("step"), record.get("split", "train")
        if isinstance(step, int) and step <= self.logged_through.get(split, -1):
            return  # a step run again after a resume: the file already has it
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json_dumps(record) + "\n")

    def on_step_end(self, trainer) -> None:
        if trainer.state.step % self.log_every == 0 or trainer.state.step == trainer.total_steps:
            self.write(trainer.last_log)

    def on_evaluate(self, trainer) -> None:
        self.write(trainer.last_log)


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class TensorBoardLogger:
    """Writes scalars to TensorBoard event files (needs the ``tensorboard`` extra:
    ``pip install 'attnlab[tensorboard]'``)."""

    def __init__(self, log_dir: Union[str, Path], *, log_every: int = 1) -> None:
        if not tensorboard_available():
            raise ImportError("TensorBoard logging needs the 'tensorboard' extra: pip install 'attnlab[tensorboard]'")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.log_every = max(1, log_every)

    def _write(self, record: dict[str, Any]) -> None:
        split = record.get("split", "train")
        for key, value in record.items():
            if key not in ("step", "split", "epoch") and isinstance(value, (int, float)):
                self.writer.add_scalar(f"{split}/{key}", value, record["step"])

    def on_step_end(self, trainer) -> None:
        if trainer.state.step % self.log_every == 0:
            self._write(trainer.last_log)

    def on_evaluate(self, trainer) -> None:
        self._write(trainer.last_log)
        self.writer.flush()

    def on_fit_end(self, trainer) -> None:
        self.writer.close()


def _format(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


class ProgressBar:
    """Progress over optimizer steps: a tqdm bar when the stream is a terminal, else plain
    ``logging`` lines (step, loss, speed, time left) every ``log_seconds``, for log files
    and schedulers; nothing when ``quiet``.

    Args:
        quiet: no bar and no lines.
        stream: the bar's stream (default: stderr); decides terminal or not.
        log_seconds: seconds between plain lines (the first and last step are always shown).
        clock: seconds, monotonic (for tests).
    """

    def __init__(self, *, quiet: bool = False, stream=None, log_seconds: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.disable = quiet or not getattr(self.stream, "isatty", lambda: False)()
        self.log_lines = not quiet and self.disable
        self.log_seconds, self.clock = log_seconds, clock
        self.bar: Optional[Any] = None

    def on_fit_start(self, trainer) -> None:
        self.start_step, self.start_time = trainer.state.step, self.clock()
        self.last_line = None
        if self.disable:
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(total=trainer.total_steps, initial=trainer.state.step, file=self.stream, unit="step",
                        dynamic_ncols=True)

    def on_step_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{trainer.last_log['loss']:.4f}", refresh=False)
        elif self.log_lines:
            now, step, total = self.clock(), trainer.state.step, trainer.total_steps
            if self.last_line is None or now - self.last_line >= self.log_seconds or step >= total:
                self.last_line = now
                done, elapsed = step - self.start_step, now - self.start_time
                rate = done / elapsed if elapsed > 0 else 0.0
                speed = f"  {rate:.2f} steps/s" if rate > 0 else ""
                if rate > 0 and step < total:
                    speed += f", about {_duration((total - step) / rate)} left"
                logger.info("step %d/%d (%d%%)  loss %.4f%s", step, total, 100 * step // max(1, total),
                            trainer.last_log["loss"], speed)

    def on_evaluate(self, trainer) -> None:
        if self.quiet:
            return
        shown = {key: value for key, value in trainer.last_log.items() if key in ("loss", "accuracy", "f1")}
        values = " ".join(f"{key} {_format(value)}" for key, value in shown.items())
        line = f"step {trainer.state.step} validation {values}"
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            logger.info("%s", line)

    def on_fit_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds} s"
