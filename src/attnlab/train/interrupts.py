"""Stopping a run cleanly: SIGINT / SIGTERM handling and the errors that end ``fit()``.

While :meth:`TransformerTrainer.fit` runs in the main thread, SIGINT (Ctrl-C) and
SIGTERM (``kill``, a scheduler's time limit) only set a flag: the current optimizer step
finishes, a resumable checkpoint is written, and ``fit`` raises
:class:`TrainingInterrupted`, which carries the checkpoint's path and the exit status a
command should end with (``128 + signal number``: 130 for SIGINT, 143 for SIGTERM).
A second signal stops at once, without saving. The previous handlers come back in
``finally``.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Optional

__all__ = ["TrainingInterrupted", "NonFiniteLossError", "InterruptGuard"]

logger = logging.getLogger(__name__)

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


class TrainingInterrupted(Exception):
    """``fit()`` stopped on a signal after writing a resumable checkpoint.

    Attributes:
        signal_number: the signal received.
        step: the last optimizer step taken (and saved).
        checkpoint: the checkpoint to resume from (``None`` without an ``output_dir``).
        exit_code: ``128 + signal_number``, the status a command should exit with.
    """

    def __init__(self, signal_number: int, step: int, checkpoint: Optional[Path]) -> None:
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint
        self.exit_code = 128 + int(signal_number)
        where = (f"resumable checkpoint written to {checkpoint}" if checkpoint is not None
                 else "no output_dir, nothing saved")
        super().__init__(f"stopped by {signal.Signals(signal_number).name} after step {step}; {where}")


class NonFiniteLossError(ValueError):
    """The training loss (or the gradient norm) became NaN or infinite; the step was not taken.

    Attributes:
        step: the optimizer step that failed (the weights are those after ``step - 1``).
        value: the loss or gradient norm.
    """

    def __init__(self, step: int, what: str, value: float, learning_rate: float) -> None:
        self.step, self.value = step, value
        super().__init__(f"the {what} is {value} at step {step} (learning rate {learning_rate:.3g}); "
                         f"training stopped before that step's update; try a lower learning rate, "
                         f"gradient clipping or fp32")


class InterruptGuard:
    """Context manager: while inside, SIGINT and SIGTERM set :attr:`received` instead of stopping.

    Installed only in the main thread (Python delivers signals there; elsewhere the
    guard does nothing). A second signal restores the previous handlers and raises
    ``KeyboardInterrupt`` at once.
    """

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signal_number: int, frame: Optional[FrameType]) -> None:
        if self.received is not None:
            self._restore()
            raise KeyboardInterrupt(f"second {signal.Signals(signal_number).name}: stopping without saving")
        self.received = signal_number
        logger.warning("%s received: finishing this step and writing a checkpoint "
                       "(send it again to stop at once)", signal.Signals(signal_number).name)

    def __enter__(self) -> "InterruptGuard":
        if threading.current_thread() is threading.main_thread():
            for signal_number in _SIGNALS:
                self._previous[signal_number] = signal.signal(signal_number, self._handle)
        return self

    def _restore(self) -> None:
        for signal_number, handler in self._previous.items():
            signal.signal(signal_number, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def __exit__(self, exc_type, exc, traceback) -> bool:
        self._restore()
        return False
