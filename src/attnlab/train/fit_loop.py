"""One call of :meth:`TransformerTrainer.fit`: its settings, checked, and the loop over steps.

Between optimizer steps the loop evaluates, keeps the best checkpoint, stops early, saves
``checkpoints/last`` and answers SIGINT or SIGTERM; the trainer itself owns the model,
the optimizer step and the checkpoints' contents.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from torch.utils.data import Dataset

from .distributed import any_process
from .evaluation import METRICS
from .interrupts import InterruptGuard, TrainingInterrupted
from .saving import SaveSchedule

__all__ = ["FitLoop"]

logger = logging.getLogger(__name__)


@dataclass
class FitLoop:
    """What one ``fit`` call trains on and how, checked on construction (the arguments are
    :meth:`TransformerTrainer.fit`'s), and the loop that runs it.

    Raises:
        ValueError: a setting out of range, named with what it must be.
    """

    trainer: Any  # the TransformerTrainer being fit (not imported: it imports this module)
    train_data: Dataset
    eval_data: Optional[Dataset]
    collate_fn: Callable
    batch_size: int
    epochs: Optional[int]
    max_steps: Optional[int]
    eval_every: Optional[int]
    eval_batch_size: int
    metric: str
    early_stopping_patience: Optional[int]
    save_every: Optional[int]
    save_every_minutes: Optional[float]
    keep_checkpoints: int
    resume_from: Union[str, Path, bool, None]
    best_on_disk: Optional[tuple[int, float]] = None  # (step, metric) of checkpoints/best when resuming
    schedule: SaveSchedule = field(init=False)  # when checkpoints/last is due

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {sorted(METRICS)}, got {self.metric!r}")
        if self.epochs is None and self.max_steps is None:
            raise ValueError("give epochs or max_steps")
        if len(self.train_data) == 0:
            raise ValueError("train_data is empty")
        if self.save_every_minutes is not None and not self.save_every_minutes > 0:
            raise ValueError(f"save_every_minutes must be > 0 or None, got {self.save_every_minutes}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        self.schedule = SaveSchedule(self.save_every, self.save_every_minutes)

    @property
    def resuming(self) -> bool:
        return self.resume_from is not None and self.resume_from is not False

    def resume(self) -> Optional[Path]:
        """Restore the trainer from ``resume_from`` where asked; the checkpoint directory read,
        or ``None`` where training starts from the first step."""
        trainer = self.trainer
        if not self.resuming:
            return None
        if self.resume_from is True:
            if trainer.output_dir is None:
                raise ValueError("resume_from=True resumes from output_dir's checkpoints; give output_dir")
            try:
                return trainer.load_checkpoint(trainer.output_dir / "checkpoints" / "last")
            except FileNotFoundError:
                logger.info("no checkpoint in %s yet: starting from the first step",
                            trainer.output_dir / "checkpoints")
                return None
        return trainer.load_checkpoint(self.resume_from)

    def planned_steps(self) -> int:
        """The optimizer steps ``epochs`` and ``max_steps`` allow, whichever is fewer."""
        per_epoch = self.trainer.steps_per_epoch(self.train_data, self.batch_size)
        planned = [n for n in (None if self.epochs is None else self.epochs * per_epoch, self.max_steps)
                   if n is not None]
        return min(planned)

    def run(self, guard: InterruptGuard) -> None:
        """Optimizer steps until the planned steps are taken, early stopping ends the run,
        or ``guard`` received a signal (then :class:`TrainingInterrupted` is raised)."""
        trainer, state = self.trainer, self.trainer.state
        while state.step < trainer.total_steps and not state.should_stop:
            batches = trainer._chunks(trainer._sampler(self.train_data, state.epoch), self.batch_size)
            groups = trainer._chunks(batches[state.batch_in_epoch:], trainer.gradient_accumulation_steps)
            for group in groups:
                trainer._optimizer_step([self.collate_fn([self.train_data[i] for i in batch])
                                         for batch in group])
                state.batch_in_epoch += len(group)
                epoch_done = state.batch_in_epoch == len(batches)
                if epoch_done:
                    state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                trainer.trigger("on_step_end")
                finished = state.step >= trainer.total_steps
                if self.eval_data is not None and (
                        finished or (self.eval_every and state.step % self.eval_every == 0)
                        or (self.eval_every is None and epoch_done)):
                    self._evaluate_and_track()
                due = finished or state.should_stop or self.schedule.due(state.step)
                saved = trainer.output_dir is not None and due
                if saved:
                    trainer._save_last(self.keep_checkpoints, self.schedule)
                if epoch_done:
                    trainer.trigger("on_epoch_end")
                if finished or state.should_stop:
                    return
                received = guard.received or 0
                if trainer.distributed.world_size > 1:
                    received = any_process(received)  # every process stops after the same step
                if received:
                    last = None
                    if trainer.output_dir is not None:
                        last = trainer.output_dir / "checkpoints" / "last"
                        if not saved:
                            trainer._save_last(self.keep_checkpoints, self.schedule)
                    raise TrainingInterrupted(received, state.step, last)

    def _saved_best_is_as_good(self, value: float) -> bool:
        # After a resume the steps since the checkpoint run again; checkpoints/best may
        # already hold a model from those steps (or later ones) that is at least as good.
        if self.best_on_disk is None:
            return False
        saved = self.best_on_disk[1]
        return METRICS[self.metric](saved, value) == saved

    def _evaluate_and_track(self) -> None:
        trainer, state, metric = self.trainer, self.trainer.state, self.metric
        patience = self.early_stopping_patience
        result = trainer.evaluate(self.eval_data, collate_fn=self.collate_fn, batch_size=self.eval_batch_size)
        value = result[metric]
        better = METRICS[metric]
        improved = state.best_metric is None or (better(value, state.best_metric) == value
                                                 and value != state.best_metric)
        if improved:
            state.best_metric, state.best_step = value, state.step
            state.evals_without_improvement = 0
        else:
            state.evals_without_improvement += 1
            if patience is not None and state.evals_without_improvement >= patience:
                state.should_stop = True
                logger.info("early stopping at step %d: no better %s in %d evaluations",
                            state.step, metric, patience)
        trainer.last_log = {"step": state.step, "split": "validation", "epoch": state.epoch, **result,
                            f"best_{metric}": state.best_metric, "best_step": state.best_step}
        trainer.trigger("on_evaluate")
        if improved and trainer.output_dir is not None:
            if self._saved_best_is_as_good(value):
                logger.info("step %d: checkpoints/best already holds a model at least as good (step %d)",
                            state.step, self.best_on_disk[0])
            else:
                trainer.save_checkpoint(trainer.output_dir / "checkpoints" / "best")
                self.best_on_disk = (state.step, value) if self.best_on_disk is not None else None

