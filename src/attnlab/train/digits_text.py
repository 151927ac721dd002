"""The ``digits-text`` task: is a short statement true of a handwritten digit?

``attnlab train --set task=digits-text`` trains an
:class:`~attnlab.models.image_text.ImageTextModel` (cross-modal attention; the baseline
with ``--set fusion=concat``) on :func:`attnlab.data.digits_text.load_digits_text`,
split by image. A batch holds ``train.batch_size`` images with all their statements, so
each image is encoded once per step. Each cross-modal layer's gate goes into
``metrics.jsonl`` as ``gate/layer_N`` with the training loss.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn
from torch.utils.data import Dataset

from .._files import load_safetensors_into, write_json
from ..data.digits_text import DigitsTextExample, collate_digits_text, digits_text_tokenizer, load_digits_text
from ..models.image_text import ImageTextConfig, ImageTextModel, gate_summary
from ..models.serialization import MODEL_FILE, TOKENIZER_FILE
from .distributed import distributed_info
from .run import REPORT_FILE, RunResult, _prepare_run_dir, _trainer_options, seed_everything
from .run_config import RunConfig
from .trainer import TransformerTrainer

__all__ = ["train_digits_text", "StatementsByImage", "GateLogger", "build_image_text_model"]

logger = logging.getLogger(__name__)


class StatementsByImage(Dataset):
    """One item per image: the list of its statements (examples sharing ``image_id``)."""

    def __init__(self, examples: Sequence[DigitsTextExample]) -> None:
        groups: dict[int, list[DigitsTextExample]] = {}
        for example in examples:
            groups.setdefault(example.image_id, []).append(example)
        self.groups = list(groups.values())

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> list[DigitsTextExample]:
        return self.groups[index]


class _Collate:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __call__(self, groups: Sequence[list[DigitsTextExample]]) -> dict:
        examples = [example for group in groups for example in group]
        return collate_digits_text(examples, self.tokenizer, share_images=True)


class GateLogger:
    """Adds each cross-modal layer's mean gate (``gate/layer_N``) to the training log.

    Reads the gates from the model's output through a forward hook that lives from
    ``on_fit_start`` to ``on_fit_end``; only training forwards are recorded.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.latest: dict[str, float] = {}
        self._handle = None

    def _record(self, module: nn.Module, inputs: Any, output: Any) -> None:
        if module.training and getattr(output, "gates", None):
            self.latest = gate_summary(output.gates)

    def on_fit_start(self, trainer) -> None:
        self._handle = self.model.register_forward_hook(self._record)

    def on_step_end(self, trainer) -> None:
        trainer.last_log.update(self.latest)

    def on_fit_end(self, trainer) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def build_image_text_model(config: RunConfig, vocab_size: int, pad_id: int = 0) -> ImageTextModel:
    """The :class:`ImageTextModel` a run config describes (text side from ``[model]``)."""
    model, image = config.model, config.image
    return ImageTextModel(ImageTextConfig(
        vocab_size=vocab_size, patch_size=image.patch_size, visual_dim=image.visual_dim,
        visual_layers=image.visual_layers, d_model=model.d_model, text_layers=model.num_layers,
        num_heads=model.num_heads, d_ff=model.d_ff, cross_layers=image.cross_layers, dropout=model.dropout,
        attention_dropout=model.attention_dropout, max_len=max(config.data.max_length, 16), pad_id=pad_id,
        gate=image.gate, fusion=image.fusion, pooling=model.pooling,
    ))


def train_digits_text(config: RunConfig, run_dir: Union[str, Path], *, resume: bool = False, quiet: bool = False,
                      device: Optional[str] = None) -> RunResult:
    """Train and test on the digits–statements task; files as for every ``attnlab train`` run."""
    run_dir = Path(run_dir)
    config = _prepare_run_dir(config, run_dir, resume)
    data, train = config.data, config.train
    info = distributed_info()
    if train.num_threads is not None:
        torch.set_num_threads(train.num_threads)
    seed_everything(train.seed)
    fractions = (1.0 - data.validation_fraction - data.test_fraction, data.validation_fraction, data.test_fraction)
    splits = load_digits_text(seed=data.split_seed, statements_per_image=config.image.statements_per_image,
                              fractions=fractions)
    if data.train_limit is not None:
        splits["train"] = splits["train"][: data.train_limit]
    tokenizer = digits_text_tokenizer()
    if info.is_main:
        tokenizer.save(str(run_dir / TOKENIZER_FILE))
    train_set, validation_set, test_set = (StatementsByImage(splits[name]) for name in ("train", "validation", "test"))
    seed_everything(train.seed)  # the model's initial weights depend on the seed alone
    model = build_image_text_model(config, tokenizer.get_vocab_size(), tokenizer.token_to_id("[PAD]"))
    resume_from = True if resume else None  # the newest whole checkpoint in checkpoints/, if any
    trainer = TransformerTrainer(model, train.learning_rate, train.warmup_steps, output_dir=run_dir,
                                 tokenizer=tokenizer, device=device, callbacks=[GateLogger(model)],
                                 **_trainer_options(config, quiet))
    collate = _Collate(tokenizer)
    start = time.perf_counter()
    state = trainer.fit(train_set, validation_set, collate_fn=collate, batch_size=train.batch_size,
                        epochs=train.epochs, max_steps=train.max_steps, eval_every=train.eval_every,
                        eval_batch_size=train.eval_batch_size, metric=train.metric,
                        early_stopping_patience=train.early_stopping_patience, save_every=train.save_every,
                        resume_from=resume_from)
    train_seconds = time.perf_counter() - start
    best = run_dir / "checkpoints" / "best"
    if (best / MODEL_FILE).is_file():
        load_safetensors_into(trainer.model, best / MODEL_FILE, device=str(trainer.device))
    test = trainer.evaluate(test_set, collate_fn=collate, batch_size=train.eval_batch_size)
    report = {
        "task": "digits-text",
        "test": test,
        "best_step": state.best_step,
        f"best_validation_{train.metric}": state.best_metric,
        "steps": state.step,
        "train_seconds": round(train_seconds, 1),  # this call's fit(), validation included
        "checkpoint": "checkpoints/best" if (best / MODEL_FILE).is_file() else "checkpoints/last",
        "label_names": ["false", "true"],
        "sizes": {name: {"images": len({e.image_id for e in examples}), "statements": len(examples)}
                  for name, examples in splits.items()},
        "processes": info.world_size,
    }
    if info.is_main:
        write_json(run_dir / REPORT_FILE, report)
        trainer.metrics_logger and trainer.metrics_logger.write({"step": state.step, "split": "test", **test})
    return RunResult(run_dir, report)
