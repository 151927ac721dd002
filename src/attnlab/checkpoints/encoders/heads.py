"""The task heads of encoder checkpoints: which one a checkpoint holds, built on attnlab's
encoder, and checked before one is written back in a family's layout.

A HuggingFace encoder checkpoint is the bare encoder, a ``*ForSequenceClassification``
(an :class:`~attnlab.EncoderClassifier` here, with the checkpoint's labels) or a
``*ForMaskedLM`` (an :class:`~attnlab.EncoderForMaskedLM`); each family's table says how
its heads are laid out (:mod:`attnlab.checkpoints._table`).
"""

from __future__ import annotations

from ...models.classifier import EncoderClassifier
from ...models.encoder import TransformerEncoder
from ...models.masked_lm import EncoderForMaskedLM
from .._table import Family
from ..errors import UnsupportedCheckpointError

__all__ = ["TASKS", "head_modules", "task_model", "task_of"]

TASKS = ("auto", "encoder", "sequence_classification", "masked_lm")


def task_of(values: dict, task: str, family: Family, names: set[str]) -> str:
    """The task ``"auto"`` means: the architecture's head, when the file holds that head.

    Some directories name a task class but hold the base model only (sentence-transformers
    saves MPNet and RoBERTa encoders under ``*ForMaskedLM``); they open as the encoder.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task != "auto":
        return task
    architectures = values.get("architectures") or []
    classifier, masked_lm = family.classifier, family.masked_lm
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        if classifier is not None and f"{classifier.classifier}.weight" in names:
            return "sequence_classification"
    if any(name.endswith("ForMaskedLM") for name in architectures):
        if masked_lm is not None and masked_lm.bias in names:
            return "masked_lm"
    return "encoder"


def _masked_lm(family: Family, encoder: TransformerEncoder, values: dict, source: str) -> EncoderForMaskedLM:
    """The family's masked-LM head on ``encoder``."""
    if family.masked_lm is None:
        raise UnsupportedCheckpointError(f"{source}: attnlab has no {family.name} masked-LM head")
    return EncoderForMaskedLM(encoder, **family.masked_lm.settings(values))


def task_model(family: Family, encoder: TransformerEncoder, values: dict, task: str, source: str):
    """The model ``task`` (as :func:`task_of` gives it) asks for: ``encoder`` itself, or the
    family's head on it."""
    if task == "encoder":
        return encoder
    if task == "masked_lm":
        return _masked_lm(family, encoder, values, source)
    return _classifier(family, encoder, values, source)


def head_modules(family: Family, model, values: dict) -> dict[str, str]:
    """attnlab head module -> HF module of ``family``'s head for ``model`` ({} for an encoder)."""
    if isinstance(model, TransformerEncoder):
        return {}
    if isinstance(model, EncoderClassifier):
        return _head_table(family, model, values)
    if isinstance(model, EncoderForMaskedLM):
        if family.masked_lm is None:
            raise UnsupportedCheckpointError(f"{family.name} has no masked-LM head in attnlab")
        settings = family.masked_lm.settings(values)
        wanted = EncoderForMaskedLM(model.encoder, **settings, device="meta").settings
        if model.settings != wanted:
            raise UnsupportedCheckpointError(
                f"this masked-LM head cannot be written as a {family.name} checkpoint: its settings are "
                f"{model.settings}, {family.name}'s are {wanted}"
            )
        return family.masked_lm.modules()
    raise TypeError(
        f"model must be an attnlab TransformerEncoder, EncoderClassifier or EncoderForMaskedLM, "
        f"got {type(model).__name__}"
    )


def _classifier(family: Family, encoder: TransformerEncoder, values: dict, source: str) -> EncoderClassifier:
    """The family's classification head on ``encoder``, with the checkpoint's labels."""
    if family.classifier is None:
        raise UnsupportedCheckpointError(f"{source}: attnlab has no {family.name} classification head")
    id2label = values.get("id2label") or {
        str(index): f"LABEL_{index}" for index in range(values.get("num_labels", 2))
    }
    labels = [str(id2label.get(str(index), id2label.get(index, index))) for index in range(len(id2label))]
    dropout = values.get("classifier_dropout")
    return EncoderClassifier(
        encoder,
        len(labels),
        dropout=encoder.config.dropout if dropout is None else float(dropout),
        label_names=labels,
        **family.classifier.settings(values),
    )


def _head_table(family: Family, model: EncoderClassifier, values: dict) -> dict[str, str]:
    """attnlab head module -> HF module of ``family``'s classification head, for ``model``."""
    if family.classifier is None:
        raise UnsupportedCheckpointError(f"{family.name} has no classification head in attnlab")
    wanted = family.classifier.settings(values)
    mine = {"pooling": model.pooling, "pooler": None if model.pooler is None else model.pooler.settings}
    if mine != wanted:
        raise UnsupportedCheckpointError(
            f"this classifier cannot be written as a {family.name} checkpoint: its head is {mine}, "
            f"{family.name}'s is {wanted}"
        )
    return family.classifier.modules()
