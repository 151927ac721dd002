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
import math
import sys
from pathlib import Path
from typing import Any, Optional, Union

__all__ = ["EVENTS", "MetricsLogger", "TensorBoardLogger", "ProgressBar", "tensorboard_available"]

logger = logging.getLogger(__name__)

EVENTS = ("on_fit_start", "on_step_end", "on_evaluate", "on_save", "on_epoch_end", "on_fit_end")


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN / inf
    return value


class MetricsLogger:
    """Appends ``trainer.last_log`` to a JSON-lines file after every logged step and evaluation."""

    def __init__(self, path: Union[str, Path], *, log_every: int = 1) -> None:
        self.path = Path(path)
        self.log_every = max(1, log_every)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (after a resume, those steps are run again)."""
        if not self.path.is_file():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({key: _clean(value) for key, value in record.items()}) + "\n")

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


class ProgressBar:
    """A tqdm bar over optimizer steps; silent when ``quiet`` or stderr is not a terminal."""

    def __init__(self, *, quiet: bool = False, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.disable = quiet or not getattr(self.stream, "isatty", lambda: False)()
        self.bar: Optional[Any] = None

    def on_fit_start(self, trainer) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=trainer.total_steps, initial=trainer.state.step, disable=self.disable,
                        file=self.stream, unit="step", dynamic_ncols=True)

    def on_step_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{trainer.last_log['loss']:.4f}", refresh=False)

    def on_evaluate(self, trainer) -> None:
        if self.bar is not None and not self.disable:
            shown = {key: value for key, value in trainer.last_log.items() if key in ("loss", "accuracy", "f1")}
            self.bar.write(f"step {trainer.state.step} validation " + " ".join(
                f"{key} {value:.4f}" for key, value in shown.items()), file=self.stream)

    def on_fit_end(self, trainer) -> None:
        if self.bar is not None:
            self.bar.close()
