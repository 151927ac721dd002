"""The evaluation loop: mean loss, accuracy and macro-F1 of a model over a data set."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .metrics import accuracy_and_f1

__all__ = ["METRICS", "evaluate_model", "move_to_device", "model_logits", "prediction_units"]

METRICS = {"accuracy": max, "f1": max, "loss": min}  # what evaluate_model reports, and how "better" is judged


def move_to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device) for value in batch)
    return batch


def model_logits(output: Any) -> Tensor:
    """``output.logits``, or the first element of a tuple output."""
    return output.logits if hasattr(output, "logits") else output[0]


def prediction_units(labels: Optional[Tensor]) -> int:
    """How many predictions a batch's mean loss averages over (masked LM: labelled tokens)."""
    if labels is None:
        return 1
    return int((labels != -100).sum()) if labels.dim() > 1 else labels.numel()


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    dataset: Dataset,
    *,
    collate_fn: Callable,
    batch_size: int = 64,
    device: Optional[torch.device] = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> dict[str, float]:
    """Mean loss, accuracy and macro-F1 over ``dataset``, read in order, in eval mode.

    Batches come from ``collate_fn`` with ``labels``: ``[B]`` class ids, or ``[B, T]``
    token ids with -100 where nothing is predicted (masked LM: scored on labelled tokens).
    The global RNG is not touched (resumed runs stay exact) and the model's mode is restored.
    """
    device = device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    loss_total, count = 0.0, 0
    predictions, labels = [], []
    try:
        for start in range(0, len(dataset), batch_size):
            items = [dataset[i] for i in range(start, min(len(dataset), start + batch_size))]
            batch = move_to_device(collate_fn(items), device)
            with autocast():
                output = model(**batch)
            target = batch["labels"]
            units = prediction_units(target)
            loss_total += float(output.loss) * units
            count += units
            logits = output.logits.float()
            if target.dim() > 1:  # masked LM: labelled tokens only
                keep = target != -100
                predicted = logits.argmax(-1)
                predictions.append(predicted if predicted.dim() == 1 else predicted[keep])
                labels.append(target[keep])
            else:
                predictions.append(logits.argmax(-1))
                labels.append(target)
    finally:
        model.train(was_training)
    if not predictions:
        raise ValueError("cannot evaluate on an empty data set")
    predicted, actual = torch.cat(predictions).cpu(), torch.cat(labels).cpu()
    num_labels = max(int(predicted.max()), int(actual.max())) + 1 if actual.numel() else 1
    return {"loss": loss_total / max(1, count), **accuracy_and_f1(predicted, actual, num_labels)}
