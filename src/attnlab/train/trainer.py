"""TransformerTrainer: the article's trainer, with its defects fixed and the usual tools around it.

Kept from the article: ``TransformerTrainer(model, learning_rate=5e-5, warmup_steps=4000)``,
Adam with betas (0.9, 0.98) and eps 1e-9, linear warm-up then cosine decay, gradient
clipping at 1.0, ``train_step(batch, criterion)``. Fixed: the cosine runs to the real
number of steps (the article hard-codes 100000); the loss is computed on a task head's
logits (the article applied it to raw encoder states); ``visualize_attention`` works
headless and on eval-mode weights.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, DistributedSampler

from .._files import load_safetensors_into
from .._precision import cpu_has_native_bf16
from .._threads import threads_for_load
from .callbacks import EVENTS, MetricsLogger, ProgressBar, TensorBoardLogger, tensorboard_available
from .checkpoint import find_resumable, rng_state, save_checkpoint, set_rng_state
from .distributed import all_reduce_mean, distributed_info
from .evaluation import METRICS, evaluate_model, model_logits, move_to_device, prediction_units
from .fit_loop import FitLoop
from .interrupts import InterruptGuard, NonFiniteLossError
from .optimizer import build_optimizer
from .saving import KEEP_CHECKPOINTS, SAVE_EVERY_MINUTES, SaveSchedule, saved_best
from .schedules import warmup_cosine_scheduler
from .visualize import attention_map, map_title, save_attention_map

__all__ = ["TransformerTrainer", "TrainerState", "PRECISIONS", "METRICS"]

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainerState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # the epoch being read
    batch_in_epoch: int = 0  # batches of that epoch already consumed
    best_metric: Optional[float] = None
    best_step: Optional[int] = None
    evals_without_improvement: int = 0
    should_stop: bool = False


class TransformerTrainer:
    """Trains a model whose forward returns ``.logits`` (and ``.loss`` given ``labels``).

    Args:
        model: the model, e.g. :class:`~attnlab.models.EncoderClassifier`.
        learning_rate: peak learning rate.
        warmup_steps: linear warm-up steps.
        total_steps: the run's optimizer steps, where the cosine reaches its end;
            ``None`` lets :meth:`fit` compute it from the data (a bare ``train_step``
            then holds the rate after warm-up).
        weight_decay: decoupled weight decay on weight matrices only (not on biases,
            norms or embeddings). 0, the default, is the article's plain Adam.
        betas, eps: Adam's, as the article.
        grad_clip: maximum gradient norm; ``None`` or 0 switches clipping off.
        gradient_accumulation_steps: batches per optimizer step in :meth:`fit`.
        precision: ``"fp32"``, ``"bf16"`` (autocast, CPU or GPU) or ``"fp16"`` (GPU, with
            a gradient scaler).
        seed: seeds data order (with the epoch); set global seeds before building the model.
        device: where to train; default: the model's device.
        output_dir: where ``metrics.jsonl``, TensorBoard files and ``checkpoints/`` go;
            only process 0 writes.
        tokenizer: saved into checkpoints when given.
        callbacks: objects with ``on_<event>`` methods (see :mod:`attnlab.train.callbacks`).
        quiet: no progress bar.
        log_every: write the training loss every this many steps.
        min_lr_ratio: where the cosine ends, as a fraction of the peak.
    """

    def __init__(
        self,
        model: nn.Module,
        learning_rate: float = 5e-5,
        warmup_steps: int = 4000,
        *,
        total_steps: Optional[int] = None,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        grad_clip: Optional[float] = 1.0,
        gradient_accumulation_steps: int = 1,
        precision: str = "fp32",
        seed: int = 0,
        device: Union[str, torch.device, None] = None,
        output_dir: Union[str, Path, None] = None,
        tokenizer: Any = None,
        callbacks: Sequence[Any] = (),
        quiet: bool = False,
        log_every: int = 1,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if total_steps is not None and total_steps <= 0:
            raise ValueError(f"total_steps must be > 0 or None, got {total_steps}")
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        first = next(model.parameters(), None)
        self.device = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
        if precision == "fp16" and self.device.type != "cuda":
            raise ValueError("precision='fp16' needs a GPU; use 'bf16' on CPU")
        if precision == "bf16" and self.device.type == "cpu" and not cpu_has_native_bf16():
            logger.warning(
                "precision='bf16' on a CPU without native bfloat16 matrix multiplication "
                "(AVX512-BF16 or AMX): attnlab's Linear layers and attention compute in float32 "
                "there (same or better numbers, about float32 speed), but bfloat16 matmuls in "
                "layers not from attnlab run torch's emulated kernels, tens of times slower"
            )
        self.model = model.to(self.device)
        self.distributed = distributed_info()
        self.train_model: nn.Module = self.model
        if self.distributed.world_size > 1:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.model, device_ids=device_ids)
        self.learning_rate, self.warmup_steps, self.min_lr_ratio = learning_rate, warmup_steps, min_lr_ratio
        self.grad_clip = grad_clip
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.precision = precision
        self.seed = seed
        self.tokenizer = tokenizer
        self.quiet, self.log_every = quiet, log_every
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.optimizer = build_optimizer(self.model, learning_rate, weight_decay=weight_decay, betas=betas, eps=eps)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.total_steps = total_steps
        self._given_total_steps = total_steps
        self.scheduler = self._build_scheduler(total_steps)
        self.state = TrainerState()
        self.finished_before_fit = False  # set by fit() when it resumes a run that had ended
        self.last_log: dict[str, Any] = {}
        self.callbacks: dict[str, list[Callable]] = defaultdict(list)
        for callback in callbacks:
            self.add_callback(callback)

    # ---- callbacks -------------------------------------------------------------------

    def add_callback(self, event_or_object: Union[str, Any], function: Optional[Callable] = None) -> None:
        """Register ``function(trainer)`` for ``event``, or every ``on_<event>`` method of an object."""
        if isinstance(event_or_object, str):
            if event_or_object not in EVENTS:
                raise ValueError(f"unknown event {event_or_object!r}; events: {EVENTS}")
            if not callable(function):
                raise TypeError(f"callback for {event_or_object!r} must be callable, got {function!r}")
            self.callbacks[event_or_object].append(function)
            return
        found = [event for event in EVENTS if callable(getattr(event_or_object, event, None))]
        if not found:
            raise TypeError(f"{type(event_or_object).__name__} has none of the event methods {EVENTS}")
        for event in found:
            self.callbacks[event].append(getattr(event_or_object, event))

    def trigger(self, event: str) -> None:
        for callback in self.callbacks.get(event, []):
            callback(self)

    # ---- optimisation ----------------------------------------------------------------

    def _build_scheduler(self, total_steps: Optional[int]):
        # Without a known length, warm up and then hold: a cosine to a guessed length
        # (the article's 100000) would be wrong for every other run.
        total = total_steps if total_steps is not None else 2**62
        return warmup_cosine_scheduler(
            self.optimizer, warmup_steps=self.warmup_steps, total_steps=total,
            min_ratio=self.min_lr_ratio if total_steps is not None else 1.0,
        )

    def _autocast(self):
        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _loss(self, batch: Any, criterion: Optional[Callable]) -> tuple[Tensor, int]:
        batch = move_to_device(batch, self.device)
        if isinstance(batch, dict):
            labels = batch.get("labels")
            if criterion is None:
                output = self.train_model(**batch)
                if output.loss is None:
                    raise ValueError("the batch has no 'labels' and no criterion was given")
                return output.loss.float(), prediction_units(labels)
            inputs = {key: value for key, value in batch.items() if key != "labels"}
            return criterion(model_logits(self.train_model(**inputs)).float(), labels), prediction_units(labels)
        if isinstance(batch, (list, tuple)) and len(batch) == 2:
            if criterion is None:
                raise ValueError("a batch given as (inputs, targets) needs a criterion")
            inputs, targets = batch
            return criterion(model_logits(self.train_model(inputs)).float(), targets), prediction_units(targets)
        raise TypeError(f"batch must be a dict or an (inputs, targets) pair, got {type(batch).__name__}")

    def _optimizer_step(self, batches: Sequence[Any], criterion: Optional[Callable] = None) -> float:
        """One optimizer step over ``batches`` (accumulated), each loss weighted by its share,
        on the cores other processes leave free (:mod:`attnlab._threads`)."""
        with threads_for_load():
            return self._optimizer_step_here(batches, criterion)

    def _optimizer_step_here(self, batches: Sequence[Any], criterion: Optional[Callable]) -> float:
        self.train_model.train()
        self.optimizer.zero_grad(set_to_none=True)
        units = [prediction_units(batch.get("labels")) if isinstance(batch, dict) else prediction_units(batch[1]) for batch in batches]
        total_units = max(1, sum(units))
        loss_sum = torch.zeros((), device=self.device)
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            # DistributedDataParallel averages gradients on the last micro-batch only
            no_sync = self.train_model.no_sync() if (not last and isinstance(self.train_model, DistributedDataParallel)) else contextlib.nullcontext()
            with no_sync:
                with self._autocast():
                    loss, _ = self._loss(batch, criterion)
                weighted = loss * (units[index] / total_units)
                (self.scaler.scale(weighted) if self.scaler is not None else weighted).backward()
            loss_sum += weighted.detach()
        learning_rate = self.scheduler.get_last_lr()[0]
        loss_value = float(all_reduce_mean(loss_sum))  # the same on every process, so all stop together
        if not math.isfinite(loss_value):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(self.state.step + 1, "training loss", loss_value, learning_rate)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if self.grad_clip:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
            if self.scaler is None and not math.isfinite(grad_norm):  # a scaler skips such steps itself
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(self.state.step + 1, "gradient norm", grad_norm, learning_rate)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.state.step += 1
        self.last_log = {"step": self.state.step, "split": "train", "epoch": self.state.epoch,
                         "loss": loss_value, "lr": learning_rate}
        if grad_norm is not None:
            self.last_log["grad_norm"] = grad_norm
        return loss_value

    def train_step(self, batch: Any, criterion: Optional[Callable] = None) -> float:
        """One optimizer step on one batch; returns its loss (the article's method).

        Args:
            batch: ``(inputs, targets)`` as in the article (``criterion`` required, applied
                to the model's logits), or a dict such as ``{"input_ids", "mask", "labels"}``
                passed to the model as keywords (its own ``loss`` used unless ``criterion``).
            criterion: e.g. ``nn.CrossEntropyLoss()``.
        """
        return self._optimizer_step([batch], criterion)

    # ---- data ------------------------------------------------------------------------

    def _sampler(self, dataset: Dataset, epoch: int) -> list[int]:
        # DistributedSampler also for one process: the same seeded permutation, so a
        # multi-process run reads exactly the single process's global batches.
        rank, world_size, _ = self.distributed
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=self.seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    @staticmethod
    def _chunks(items: Sequence, size: int) -> list:
        return [items[start:start + size] for start in range(0, len(items), size)]

    def steps_per_epoch(self, dataset: Dataset, batch_size: int) -> int:
        batches = math.ceil(math.ceil(len(dataset) / self.distributed.world_size) / batch_size)
        return math.ceil(batches / self.gradient_accumulation_steps)

    # ---- evaluation ------------------------------------------------------------------

    def evaluate(self, dataset: Dataset, *, collate_fn: Callable, batch_size: int = 64) -> dict[str, float]:
        """Mean loss, accuracy and macro-F1 over ``dataset`` (see :func:`evaluate_model`)."""
        return evaluate_model(self.model, dataset, collate_fn=collate_fn, batch_size=batch_size,
                              device=self.device, autocast=self._autocast)

    # ---- checkpoints -----------------------------------------------------------------

    def trainer_state_dict(self) -> dict[str, Any]:
        """Everything beyond the weights needed to continue bit for bit."""
        state = {
            "trainer": asdict(self.state),
            "total_steps": self.total_steps,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "world_size": self.distributed.world_size,
        }
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def save_checkpoint(self, directory: Union[str, Path], *, keep: int = 1) -> Optional[Path]:
        """Write a checkpoint directory atomically (process 0 only).

        Args:
            directory: e.g. ``output_dir / "checkpoints" / "last"``.
            keep: versions to keep (``last``, ``last.1``...), this one included.
        """
        if not self.distributed.is_main:
            return None
        path = save_checkpoint(directory, self.model, self.trainer_state_dict(), tokenizer=self.tokenizer,
                               keep=keep)
        self.trigger("on_save")
        return path

    def load_checkpoint(self, directory: Union[str, Path]) -> Path:
        """Restore weights, optimizer, scheduler, RNG states and the data position.

        Every file is checked first; when ``directory`` is damaged, its newest whole
        rotated version (``last.1``, ``last.2``) is used with a warning.

        Returns:
            The checkpoint directory actually read.

        Raises:
            FileNotFoundError: no checkpoint at ``directory``.
            CorruptFileError: (a ``ValueError``, in :mod:`attnlab.train`) every version is damaged.
        """
        from ..checkpoints.attnlab_layout import MODEL_FILE

        directory, state = find_resumable(directory)
        load_safetensors_into(self.model, directory / MODEL_FILE, device=str(self.device))
        self._restore_trainer_state(state)
        return directory

    def _restore_trainer_state(self, state: dict[str, Any]) -> None:
        self.total_steps = state["total_steps"]
        self.scheduler = self._build_scheduler(self.total_steps)
        self.scheduler.load_state_dict(state["scheduler"])
        # after the scheduler: building one resets the optimizer's rates, loading restores them
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.state = TrainerState(**state["trainer"])
        set_rng_state(state["rng"])

    # ---- the loop --------------------------------------------------------------------

    def _default_callbacks(self, eval_metric: str) -> None:
        if self._callbacks_installed:
            return
        self._callbacks_installed = True
        self.add_callback(ProgressBar(quiet=self.quiet or not self.distributed.is_main))
        self._install_metrics_logger()
        if self.output_dir is not None and self.distributed.is_main and tensorboard_available():
            self.add_callback(TensorBoardLogger(self.output_dir / "tensorboard", log_every=self.log_every))

    def _install_metrics_logger(self) -> None:
        if self.metrics_logger is None and self.output_dir is not None and self.distributed.is_main:
            self.metrics_logger = MetricsLogger(self.output_dir / "metrics.jsonl", log_every=self.log_every)
            self.add_callback(self.metrics_logger)

    _callbacks_installed = False
    metrics_logger: Optional[MetricsLogger] = None

    def _save_last(self, keep: int, schedule: SaveSchedule) -> None:
        started = time.monotonic()
        self.save_checkpoint(self.output_dir / "checkpoints" / "last", keep=keep)
        schedule.saved(started, time.monotonic())

    def fit(
        self,
        train_data: Dataset,
        eval_data: Optional[Dataset] = None,
        *,
        collate_fn: Callable,
        batch_size: int = 32,
        epochs: Optional[int] = 1,
        max_steps: Optional[int] = None,
        eval_every: Optional[int] = None,
        eval_batch_size: int = 128,
        metric: str = "accuracy",
        early_stopping_patience: Optional[int] = None,
        save_every: Optional[int] = None,
        save_every_minutes: Optional[float] = SAVE_EVERY_MINUTES,
        keep_checkpoints: int = KEEP_CHECKPOINTS,
        resume_from: Union[str, Path, bool, None] = None,
    ) -> TrainerState:
        """Train on ``train_data``; evaluate on ``eval_data``, keep the best checkpoint.

        With an ``output_dir``, a resumable ``checkpoints/last`` is written every
        ``save_every`` steps, every ``save_every_minutes`` of training, at the end, and
        when SIGINT or SIGTERM arrives (then :class:`TrainingInterrupted` is raised; see
        :mod:`attnlab.train.interrupts`).

        Args:
            train_data: a map-style data set; items go through ``collate_fn``.
            eval_data: validation data (never the test split).
            collate_fn: items -> batch dict with ``labels``.
            batch_size: batch per process and per accumulation step.
            epochs: passes over ``train_data``; ``max_steps`` caps optimizer steps.
            eval_every: evaluate every this many steps; ``None``: after every epoch.
            metric: ``"accuracy"``, ``"f1"`` or ``"loss"``, for best checkpoint and early stopping.
            early_stopping_patience: stop after this many evaluations without improvement.
            save_every: also write ``checkpoints/last`` every this many steps.
            save_every_minutes: write ``checkpoints/last`` after this many minutes of
                training since the last save (and at least 50 times the last save's
                duration, so saving costs under 2 %); ``None``: no time-based saves.
            keep_checkpoints: resumable checkpoints kept (``last``, ``last.1``, ...).
            resume_from: a checkpoint directory to continue from exactly (its newest whole
                rotated version, when it is damaged); ``True``: the newest whole one in
                ``output_dir/checkpoints``, or the first step when there is none yet.
                A finished run is left as it is. ``metrics.jsonl`` is appended to; steps it
                already holds are not logged twice.

        Raises:
            TrainingInterrupted: SIGINT or SIGTERM arrived; a resumable checkpoint was written.
            NonFiniteLossError: (a ``ValueError``) the loss or gradient norm became NaN or infinite.
        """
        loop = FitLoop(self, train_data, eval_data, collate_fn=collate_fn, batch_size=batch_size,
                       epochs=epochs, max_steps=max_steps, eval_every=eval_every,
                       eval_batch_size=eval_batch_size, metric=metric,
                       early_stopping_patience=early_stopping_patience, save_every=save_every,
                       save_every_minutes=save_every_minutes, keep_checkpoints=keep_checkpoints,
                       resume_from=resume_from)
        loaded = loop.resume()
        if loaded is None:
            if self._given_total_steps is None and self.state.step == 0:
                self.total_steps = loop.planned_steps()
                self.scheduler = self._build_scheduler(self.total_steps)
            elif self.total_steps is None:
                raise ValueError("fit() after train_step() needs total_steps given to the constructor")
            if self.warmup_steps >= self.total_steps:
                logger.warning("warmup_steps=%d >= total_steps=%d: the run ends inside the warm-up",
                               self.warmup_steps, self.total_steps)
        self._install_metrics_logger()
        if self.metrics_logger is not None:
            self.metrics_logger.open(resuming=loop.resuming)
        if loaded is not None and (self.state.step >= self.total_steps or self.state.should_stop):
            logger.info("the run in %s already finished at step %d; nothing to do", loaded, self.state.step)
            self.finished_before_fit = True
            return self.state
        if loop.resuming and self.output_dir is not None:
            loop.best_on_disk = saved_best(self.output_dir / "checkpoints" / "best")
        self._default_callbacks(metric)
        self.trigger("on_fit_start")
        try:
            with InterruptGuard() as guard:
                loop.run(guard)
        finally:
            self.trigger("on_fit_end")
        return self.state

    # ---- looking inside --------------------------------------------------------------

    def visualize_attention(
        self,
        input_sequence: Tensor,
        layer_idx: int = 0,
        head_idx: int = 0,
        *,
        path: Union[str, Path, None] = None,
        tokens: Optional[Sequence[str]] = None,
    ) -> np.ndarray:
        """The ``[T, T]`` attention map of one head for the first sequence, in eval mode.

        Unlike the article, this never calls ``plt.show()``: with ``path`` it writes a
        PNG (Agg, headless); the model's train/eval mode is restored afterwards.

        Args:
            input_sequence: ``[T]`` or ``[B, T]`` token ids (the first row is shown).
            layer_idx: 0-based layer index (the picture says "Layer 1" for 0).
            head_idx: 0-based head index (the picture says "head 1" for 0).
            path: where to write the PNG, if anywhere.
            tokens: the tokens of the shown sequence, to label the axes with.
        """
        attn = attention_map(self.model, input_sequence, layer_idx, head_idx)
        if path is not None:
            shown = None if tokens is None else list(tokens)[: attn.shape[0]]
            save_attention_map(attn, path, title=map_title(layer_idx, head_idx), tokens=shown)
        return attn
