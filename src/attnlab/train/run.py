"""An ``attnlab train`` run from a :class:`RunConfig`: data, tokenizer, model, training,
final test report. Every file goes into the run directory:

``config.json`` (the resolved config), ``tokenizer.json``, ``metrics.jsonl``,
``checkpoints/{best,last}/``, ``test_report.json`` (and ``pretrain/`` when a masked-LM
phase runs first).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from .._files import load_safetensors_into, write_json
from ..data import (
    DatasetSplits, MaskedLMCollator, PaddingCollator, TokenizedDataset, encode_texts, load_rotten_tomatoes,
    load_text_classification, load_tokenizer_file, special_ids, train_tokenizer,
)
from ..data.tokenization import TOKENIZER_KINDS
from ..models import EncoderClassifier, EncoderForMaskedLM, build_encoder, load_pretrained_tokenizer
from ..models.serialization import MODEL_FILE, TOKENIZER_FILE
from .checkpoint import TRAINER_STATE_FILE, find_resumable, set_rng_state
from .distributed import distributed_info
from .run_config import RunConfig
from .tasks import get_task
from .trainer import TransformerTrainer

__all__ = ["RunResult", "train_run", "train_text_classification", "load_splits", "seed_everything"]

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.json"
REPORT_FILE = "test_report.json"


@dataclass
class RunResult:
    run_dir: Path
    report: dict[str, Any]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_splits(config: RunConfig) -> DatasetSplits:
    data = config.data
    options = {"seed": data.split_seed, "validation_fraction": data.validation_fraction,
               "test_fraction": data.test_fraction}
    if data.path is not None:
        splits = load_text_classification(data.path, text_column=data.text_column, label_column=data.label_column,
                                          labels=data.labels, format=data.format, **options)
    else:
        splits = load_rotten_tomatoes(**options)
    if data.train_limit is not None:
        splits = DatasetSplits(splits.train[:data.train_limit], splits.validation, splits.test, splits.label_names)
    return splits


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _tokenizer(config: RunConfig, splits: DatasetSplits, run_dir: Path, resume: bool):
    """Train (process 0), load the run's own, a given file, or the pretrained model's tokenizer."""
    path = run_dir / TOKENIZER_FILE
    if resume or not distributed_info().is_main:
        _barrier() if not distributed_info().is_main and not resume else None
        return load_tokenizer_file(path)
    if config.model.pretrained:
        tokenizer = load_pretrained_tokenizer(config.model.pretrained)
    elif config.data.tokenizer in TOKENIZER_KINDS:
        tokenizer = train_tokenizer([text for text, _ in splits.train], vocab_size=config.data.vocab_size,
                                    kind=config.data.tokenizer, lowercase=config.data.lowercase,
                                    min_frequency=config.data.min_frequency)
    else:
        tokenizer = load_tokenizer_file(config.data.tokenizer)
    tokenizer.save(str(path))
    _barrier()
    return tokenizer


def _encode(tokenizer, examples, max_length: int) -> TokenizedDataset:
    return TokenizedDataset(encode_texts(tokenizer, [text for text, _ in examples], max_length=max_length),
                            [label for _, label in examples])


def _build_classifier(config: RunConfig, tokenizer, label_names) -> EncoderClassifier:
    model = config.model
    pad_id = special_ids(tokenizer).get("[PAD]", 0)
    encoder = build_encoder(
        tokenizer.get_vocab_size(), pretrained=model.pretrained, d_model=model.d_model,
        num_layers=model.num_layers, num_heads=model.num_heads, d_ff=model.d_ff, dropout=model.dropout,
        max_len=max(config.data.max_length, 16), attention_dropout=model.attention_dropout, pad_id=pad_id,
        position=model.position, norm_first=model.norm_first,
    )
    return EncoderClassifier(encoder, len(label_names), pooling=model.pooling, dropout=model.classifier_dropout,
                             label_names=label_names)


def _trainer_options(config: RunConfig, quiet: bool) -> dict[str, Any]:
    train = config.train
    return {"weight_decay": train.weight_decay, "grad_clip": train.grad_clip,
            "gradient_accumulation_steps": train.gradient_accumulation_steps, "precision": train.precision,
            "seed": train.seed, "quiet": quiet, "log_every": train.log_every, "min_lr_ratio": train.min_lr_ratio}


def _pretrain_masked_lm(config, model, tokenizer, train_set, run_dir, resume, quiet) -> None:
    """Masked-LM steps on the training texts; the classifier then starts from this encoder."""
    train = config.train
    directory = run_dir / "pretrain"
    last = directory / "checkpoints" / "last"
    lm = EncoderForMaskedLM(model.encoder)
    if resume and (last / TRAINER_STATE_FILE).is_file():
        last, state = find_resumable(last)  # its newest whole version (last, last.1, last.2)
        if state["trainer"]["step"] >= train.mlm_steps:
            load_safetensors_into(lm, last / MODEL_FILE)
            set_rng_state(state["rng"])  # where an uninterrupted run starts classifying
            return
    else:
        last = True if resume else None  # resume: the newest whole version, or the first step
    ids = special_ids(tokenizer)
    collate = MaskedLMCollator(ids["[PAD]"], ids["[MASK]"], tokenizer.get_vocab_size(), list(ids.values()),
                               probability=train.mlm_probability, seed=train.seed)
    trainer = TransformerTrainer(lm, train.mlm_learning_rate, min(train.warmup_steps, train.mlm_steps // 10),
                                 output_dir=directory, tokenizer=tokenizer, **_trainer_options(config, quiet))
    trainer.fit(TokenizedDataset(train_set.input_ids), collate_fn=collate, batch_size=train.batch_size,
                epochs=None, max_steps=train.mlm_steps, save_every=train.save_every, resume_from=last)


def _prepare_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> RunConfig:
    config_path = run_dir / CONFIG_FILE
    if resume:
        if not config_path.is_file():
            raise FileNotFoundError(f"cannot resume: {config_path} does not exist")
        return RunConfig.from_json(config_path)
    if distributed_info().is_main:
        if config_path.exists():
            raise ValueError(f"{run_dir} already holds a run; pass --resume to continue it or choose another --out")
        run_dir.mkdir(parents=True, exist_ok=True)
        config_path.write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    _barrier()
    return config


def train_run(config: RunConfig, run_dir: Union[str, Path], *, resume: bool = False, quiet: bool = False,
              device: Optional[str] = None) -> RunResult:
    """Run the whole job of the config's task; returns the test report (process 0 writes every file)."""
    if resume:
        config_path = Path(run_dir) / CONFIG_FILE
        if config_path.is_file():
            config = RunConfig.from_json(config_path)
    return get_task(config.data.task).run(config, run_dir, resume=resume, quiet=quiet, device=device)


def train_text_classification(config: RunConfig, run_dir: Union[str, Path], *, resume: bool = False,
                              quiet: bool = False, device: Optional[str] = None) -> RunResult:
    """The text-classification task: tokenizer, encoder classifier, training, test report."""
    run_dir = Path(run_dir)
    config = _prepare_run_dir(config, run_dir, resume)
    train = config.train
    info = distributed_info()
    if train.num_threads is not None:
        torch.set_num_threads(train.num_threads)
    seed_everything(train.seed)
    splits = load_splits(config)
    tokenizer = _tokenizer(config, splits, run_dir, resume)
    max_length = config.data.max_length
    train_set, validation_set, test_set = (_encode(tokenizer, splits[name], max_length)
                                           for name in ("train", "validation", "test"))
    seed_everything(train.seed)  # the model's initial weights depend on the seed alone
    model = _build_classifier(config, tokenizer, splits.label_names)
    if train.mlm_steps:
        _pretrain_masked_lm(config, model, tokenizer, train_set, run_dir, resume, quiet)
    resume_from = True if resume else None  # the newest whole checkpoint in checkpoints/, if any
    trainer = TransformerTrainer(model, train.learning_rate, train.warmup_steps, output_dir=run_dir,
                                 tokenizer=tokenizer, device=device, **_trainer_options(config, quiet))
    collate = PaddingCollator(special_ids(tokenizer).get("[PAD]", 0))
    state = trainer.fit(train_set, validation_set, collate_fn=collate, batch_size=train.batch_size,
                        epochs=train.epochs, max_steps=train.max_steps, eval_every=train.eval_every,
                        eval_batch_size=train.eval_batch_size, metric=train.metric,
                        early_stopping_patience=train.early_stopping_patience, save_every=train.save_every,
                        resume_from=resume_from)
    best = run_dir / "checkpoints" / "best"
    _barrier()  # process 0 may still be writing the last best checkpoint
    if (best / MODEL_FILE).is_file():
        load_safetensors_into(trainer.model, best / MODEL_FILE, device=str(trainer.device))
    test = trainer.evaluate(test_set, collate_fn=collate, batch_size=train.eval_batch_size)
    report = {
        "test": test,
        "best_step": state.best_step,
        f"best_validation_{train.metric}": state.best_metric,
        "steps": state.step,
        "checkpoint": "checkpoints/best" if (best / MODEL_FILE).is_file() else "checkpoints/last",
        "label_names": list(splits.label_names),
        "sizes": splits.sizes(),
        "processes": info.world_size,
    }
    if info.is_main:
        write_json(run_dir / REPORT_FILE, report)
        trainer.metrics_logger and trainer.metrics_logger.write({"step": state.step, "split": "test", **test})
    return RunResult(run_dir, report)
