"""When :meth:`TransformerTrainer.fit` writes checkpoints, and what ``checkpoints/best`` holds.

Periodic saves keep a killed run's loss of work small: ``checkpoints/last`` is written
every ``save_every_minutes`` of training (default :data:`SAVE_EVERY_MINUTES`), never
sooner than :data:`SAVE_COST_FACTOR` times the last save's duration, so saving costs at
most 2 % of the time whatever the model's size.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Optional, Union

import torch

from .._files import read_json
from .checkpoint import MANIFEST_FILE, TRAINER_STATE_FILE

__all__ = ["SAVE_EVERY_MINUTES", "SAVE_COST_FACTOR", "KEEP_CHECKPOINTS", "SaveSchedule", "saved_best"]

logger = logging.getLogger(__name__)

# A resumable checkpoint every minute of training, so a killed run loses at most that
# much. One save of the default `attnlab train` model (1.3 M parameters and Adam's
# moments, 15 MB) takes 0.025-0.09 s with fsync (median 0.033 s), under 0.2 % of the interval (measured:
# docs/design.md, "Training runs"); the cost factor keeps larger models under 2 %.
SAVE_EVERY_MINUTES = 1.0
SAVE_COST_FACTOR = 50  # 1 / 50 = 2 %
KEEP_CHECKPOINTS = 3  # checkpoints/last, last.1, last.2: a damaged newest one has fallbacks


class SaveSchedule:
    """Whether a periodic ``checkpoints/last`` is due after a step.

    Args:
        every_steps: every this many steps (``None``: not by steps).
        every_minutes: after this many minutes since the last save, and at least
            ``SAVE_COST_FACTOR`` times that save's duration (``None``: not by time).
    """

    def __init__(self, every_steps: Optional[int], every_minutes: Optional[float]) -> None:
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.last_end, self.last_cost = time.monotonic(), 0.0

    def due(self, step: int) -> bool:
        if self.every_steps and step % self.every_steps == 0:
            return True
        if self.every_minutes is None:
            return False
        wait = max(self.every_minutes * 60.0, SAVE_COST_FACTOR * self.last_cost)
        return time.monotonic() - self.last_end >= wait

    def saved(self, started: float, ended: float) -> None:
        """Record a save that ran from ``started`` to ``ended`` (``time.monotonic()`` seconds)."""
        self.last_end, self.last_cost = ended, ended - started


def saved_best(directory: Union[str, Path]) -> Optional[tuple[int, float]]:
    """``(best_step, best_metric)`` of a best checkpoint, or ``None`` when there is none
    (or it cannot be read: then the next best model replaces it)."""
    directory = Path(directory)
    try:
        if (directory / MANIFEST_FILE).is_file():
            trainer = read_json(directory / MANIFEST_FILE).get("trainer") or {}
        elif (directory / TRAINER_STATE_FILE).is_file():
            state = torch.load(directory / TRAINER_STATE_FILE, map_location="cpu", weights_only=True)
            trainer = state["trainer"]
        else:
            return None
    except Exception as error:  # noqa: BLE001 - any damage means: nothing to protect
        logger.warning("%s cannot be read (%s); the next best model replaces it", directory, error)
        return None
    step, value = trainer.get("best_step"), trainer.get("best_metric")
    if not isinstance(step, int) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return step, float(value)
