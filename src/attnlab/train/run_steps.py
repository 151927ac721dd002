"""The steps every ``attnlab train`` task shares: run directory, seeding, trainer options,
and the run's ending (reload the best checkpoint, test, write the report).

Every file goes into the run directory: ``config.json`` (the resolved config),
``tokenizer.json``, ``metrics.jsonl``, ``checkpoints/{best,last}/`` and
``test_report.json``. A task calls :func:`start_run` first and :func:`finish_run` last;
what lies between (data, tokenizer, model) is its own.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from .._files import load_safetensors_into, read_json, write_json
from ..checkpoints.attnlab_layout import MODEL_FILE
from .distributed import distributed_info
from .run_config import ARCHITECTURE_FIELDS, RunConfig
from .run_dir import hold_run_dir
from .trainer import TrainerState, TransformerTrainer

__all__ = [
    "record_pretrained_architecture",
    "CONFIG_FILE", "REPORT_FILE", "RunResult", "check_split_sizes", "seed_everything", "barrier", "prepare_run_dir", "start_run",
    "trainer_options", "resume_checkpoint", "fit", "finish_run",
]

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.json"
REPORT_FILE = "test_report.json"


@dataclass
class RunResult:
    """A finished run: its directory and the test report written there."""

    run_dir: Path
    report: dict[str, Any]


def check_split_sizes(sizes: dict[str, int], config: RunConfig) -> None:
    """Refuse, before anything is written, a split that would be empty.

    Args:
        sizes: ``{"train": n, "validation": n, "test": n}``.
        config: the run's config, to name the settings.

    Raises:
        ValueError: naming the empty split and the setting that decides it.
    """
    data = config.data
    total = sum(sizes.values())
    if not sizes.get("train"):
        raise ValueError(f"{total} examples leave none for training after data.validation_fraction="
                         f"{data.validation_fraction} and data.test_fraction={data.test_fraction}; use more examples")
    for split, setting in (("validation", "validation_fraction"), ("test", "test_fraction")):
        if not sizes.get(split):
            fraction = getattr(data, setting)
            needed = "more examples" if total < 2 else f"at least data.{setting}={1 / total:.3g} or more examples"
            raise ValueError(f"{total} examples give an empty {split} split at data.{setting}={fraction} "
                             f"(round({total} x {fraction}) = 0); use {needed}")


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def barrier() -> None:
    """Wait for every process under ``torchrun``; nothing without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def prepare_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> RunConfig:
    """Write ``config.json`` into a new run directory (process 0), or read it back on resume."""
    config_path = run_dir / CONFIG_FILE
    if resume:
        if not config_path.is_file():
            raise FileNotFoundError(f"cannot resume: {config_path} does not exist")
        if distributed_info().is_main:
            hold_run_dir(run_dir)
        return RunConfig.from_json(config_path)
    if distributed_info().is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        hold_run_dir(run_dir)  # a second run started beside this one is refused here
        if config_path.exists():
            raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
        write_json(config_path, config.to_dict())
    barrier()
    return config


def record_pretrained_architecture(config: RunConfig, run_dir: Path, encoder_config: Any, resume: bool) -> None:
    """Write the checkpoint's architecture (``d_model``, ``num_layers``, ...) into the run's
    ``config.json`` in place of [model]'s defaults, which a pretrained run does not use."""
    if not config.model.pretrained or resume or not distributed_info().is_main:
        return
    config_path = run_dir / CONFIG_FILE
    values = read_json(config_path)
    values["model"].update({name: getattr(encoder_config, name) for name in ARCHITECTURE_FIELDS})
    write_json(config_path, values)


def start_run(config: RunConfig, run_dir: Path, resume: bool) -> RunConfig:
    """The run's config (saved, or read back), with torch's threads set and every RNG seeded."""
    config = prepare_run_dir(config, run_dir, resume)
    if config.train.num_threads is not None:
        torch.set_num_threads(config.train.num_threads)
    seed_everything(config.train.seed)
    return config


def trainer_options(config: RunConfig, quiet: bool) -> dict[str, Any]:
    """The :class:`TransformerTrainer` keywords that come from ``[train]``."""
    train = config.train
    return {"weight_decay": train.weight_decay, "grad_clip": train.grad_clip,
            "gradient_accumulation_steps": train.gradient_accumulation_steps, "precision": train.precision,
            "seed": train.seed, "quiet": quiet, "log_every": train.log_every, "min_lr_ratio": train.min_lr_ratio}


def resume_checkpoint(run_dir: Path, resume: bool) -> Optional[bool]:
    """What ``trainer.fit(resume_from=...)`` takes: ``True`` when resuming (the newest whole
    checkpoint in ``checkpoints/``, or step 1 when none was written yet), else ``None``."""
    return True if resume else None


def fit(trainer: TransformerTrainer, config: RunConfig, train_set: Dataset, validation_set: Dataset, *,
        collate_fn: Callable, run_dir: Path, resume: bool) -> TrainerState:
    """``trainer.fit`` with every loop setting from ``[train]``, resuming where the run stopped."""
    train = config.train
    return trainer.fit(train_set, validation_set, collate_fn=collate_fn, batch_size=train.batch_size,
                       epochs=train.epochs, max_steps=train.max_steps, eval_every=train.eval_every,
                       eval_batch_size=train.eval_batch_size, metric=train.metric,
                       early_stopping_patience=train.early_stopping_patience, save_every=train.save_every,
                       save_every_minutes=train.save_every_minutes, keep_checkpoints=train.keep_checkpoints,
                       resume_from=resume_checkpoint(run_dir, resume))


def finish_run(
    trainer: TransformerTrainer, state: TrainerState, config: RunConfig, run_dir: Path, test_set: Dataset, *,
    collate_fn: Callable, report: Optional[dict[str, Any]] = None,
) -> RunResult:
    """Reload ``checkpoints/best``, test, and write ``test_report.json`` and the test line of
    ``metrics.jsonl`` (process 0).

    Under ``torchrun`` every process first waits for process 0 to finish writing the
    last best checkpoint, so that all of them test the same weights.

    Args:
        report: the task's own entries, added after the common ones.
    """
    report_path = run_dir / REPORT_FILE
    if getattr(trainer, "finished_before_fit", False) and report_path.is_file():
        # --resume on a finished run: say so, change nothing
        logger.warning("%s already finished at step %d; nothing was changed", run_dir, state.step)
        return RunResult(run_dir, read_json(report_path))
    best = run_dir / "checkpoints" / "best"
    barrier()  # process 0 may still be writing the last best checkpoint
    has_best = (best / MODEL_FILE).is_file()
    if has_best:
        load_safetensors_into(trainer.model, best / MODEL_FILE, device=str(trainer.device))
    test = trainer.evaluate(test_set, collate_fn=collate_fn, batch_size=config.train.eval_batch_size)
    info = distributed_info()
    full_report = {
        "test": test,
        "best_step": state.best_step,
        f"best_validation_{config.train.metric}": state.best_metric,
        "steps": state.step,
        "checkpoint": "checkpoints/best" if has_best else "checkpoints/last",
        **(report or {}),
        "processes": info.world_size,
    }
    if info.is_main:
        write_json(run_dir / REPORT_FILE, full_report)
        if trainer.metrics_logger:
            trainer.metrics_logger.write({"step": state.step, "split": "test", **test})
    return RunResult(run_dir, full_report)
