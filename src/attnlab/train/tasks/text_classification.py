"""The ``text-classification`` task (the default): labelled texts in, a classifier out.

Data from the embedded Rotten Tomatoes snippets or the CSV/JSONL file in ``data.path``;
a tokenizer trained on the training split (or loaded); an
:class:`~attnlab.models.EncoderClassifier`, optionally after ``train.mlm_steps`` of
masked-LM pre-training on the training texts (written under ``pretrain/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union


from ..._files import load_safetensors_into
from ...data import (
    DatasetSplits, MaskedLMCollator, PaddingCollator, TokenizedDataset, encode_texts, load_rotten_tomatoes,
    load_text_classification, load_tokenizer_file, special_ids, tokenizer_pad_id, train_tokenizer,
)
from ...data.tokenization import TOKENIZER_KINDS
from ...checkpoints.factory import build_encoder, load_pretrained_tokenizer
from ...models import EncoderClassifier, EncoderForMaskedLM
from ...checkpoints.attnlab_layout import MODEL_FILE, TOKENIZER_FILE
from ..checkpoint import TRAINER_STATE_FILE, find_resumable, set_rng_state
from ..distributed import distributed_info
from ..run_config import RunConfig
from ..run_steps import (
    RunResult, barrier, check_split_sizes, finish_run, fit, record_pretrained_architecture, seed_everything,
    start_run, trainer_options,
)
from ..trainer import TransformerTrainer
from . import DEFAULT_TASK, TASKS, Task

__all__ = ["TASK", "train_text_classification", "load_splits"]


def load_splits(config: RunConfig) -> DatasetSplits:
    """The train/validation/test split the ``[data]`` section describes."""
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


def _tokenizer(config: RunConfig, splits: DatasetSplits, run_dir: Path, resume: bool):
    """Train (process 0), load the run's own, a given file, or the pretrained model's tokenizer."""
    path = run_dir / TOKENIZER_FILE
    if resume or not distributed_info().is_main:
        barrier() if not distributed_info().is_main and not resume else None
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
    barrier()
    return tokenizer


def _encode(tokenizer, examples, max_length: int) -> TokenizedDataset:
    return TokenizedDataset(encode_texts(tokenizer, [text for text, _ in examples], max_length=max_length),
                            [label for _, label in examples])


def _build_classifier(config: RunConfig, tokenizer, label_names) -> EncoderClassifier:
    model = config.model
    encoder = build_encoder(
        tokenizer.get_vocab_size(), pretrained=model.pretrained, d_model=model.d_model,
        num_layers=model.num_layers, num_heads=model.num_heads, d_ff=model.d_ff, dropout=model.dropout,
        max_len=max(config.data.max_length, 16), attention_dropout=model.attention_dropout,
        pad_id=tokenizer_pad_id(tokenizer, default=0), position=model.position, norm_first=model.norm_first,
    )
    return EncoderClassifier(encoder, len(label_names), pooling=model.pooling, dropout=model.classifier_dropout,
                             label_names=label_names)


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
    collate = MaskedLMCollator(tokenizer_pad_id(tokenizer, default=0), ids["[MASK]"], tokenizer.get_vocab_size(),
                               list(ids.values()), probability=train.mlm_probability, seed=train.seed)
    trainer = TransformerTrainer(lm, train.mlm_learning_rate, min(train.warmup_steps, train.mlm_steps // 10),
                                 output_dir=directory, tokenizer=tokenizer, **trainer_options(config, quiet))
    trainer.fit(TokenizedDataset(train_set.input_ids), collate_fn=collate, batch_size=train.batch_size,
                epochs=None, max_steps=train.mlm_steps, save_every=train.save_every, resume_from=last)


def train_text_classification(config: RunConfig, run_dir: Union[str, Path], *, resume: bool = False,
                              quiet: bool = False, device: Optional[str] = None) -> RunResult:
    """The text-classification task: tokenizer, encoder classifier, training, test report."""
    run_dir = Path(run_dir)
    config = start_run(config, run_dir, resume)
    train = config.train
    splits = load_splits(config)
    tokenizer = _tokenizer(config, splits, run_dir, resume)
    max_length = config.data.max_length
    train_set, validation_set, test_set = (_encode(tokenizer, splits[name], max_length)
                                           for name in ("train", "validation", "test"))
    seed_everything(train.seed)  # the model's initial weights depend on the seed alone
    model = _build_classifier(config, tokenizer, splits.label_names)
    record_pretrained_architecture(config, run_dir, model.encoder.config, resume)
    if train.mlm_steps:
        _pretrain_masked_lm(config, model, tokenizer, train_set, run_dir, resume, quiet)
    trainer = TransformerTrainer(model, train.learning_rate, train.warmup_steps, output_dir=run_dir,
                                 tokenizer=tokenizer, device=device, **trainer_options(config, quiet))
    collate = PaddingCollator(tokenizer_pad_id(tokenizer, default=0))
    state = fit(trainer, config, train_set, validation_set, collate_fn=collate, run_dir=run_dir, resume=resume)
    return finish_run(trainer, state, config, run_dir, test_set, collate_fn=collate,
                      report={"label_names": list(splits.label_names), "sizes": splits.sizes()})


def check_text_classification(config: RunConfig) -> None:
    """Before anything is written: the data reads, its labels are valid and every split has examples."""
    splits = load_splits(config)
    check_split_sizes(splits.sizes(), config)


TASK = Task(DEFAULT_TASK, TASKS[DEFAULT_TASK][1], train_text_classification, check=check_text_classification)
