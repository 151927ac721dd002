"""Classification metrics from predicted and true label ids."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["accuracy_and_f1"]


def accuracy_and_f1(predictions: Tensor, labels: Tensor, num_labels: int) -> dict[str, float]:
    """Accuracy and macro-averaged F1 (classes absent from both count as F1 = 0 only if
    they were predicted or present; otherwise they are left out).

    Shape:
        ``predictions``, ``labels``: ``[N]`` integer ids.
    """
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ")
    if labels.numel() == 0:
        return {"accuracy": float("nan"), "f1": float("nan")}
    confusion = torch.bincount(labels * num_labels + predictions, minlength=num_labels**2).reshape(
        num_labels, num_labels
    )  # [true, predicted]
    true_positive = confusion.diag().double()
    predicted, actual = confusion.sum(0).double(), confusion.sum(1).double()
    seen = (predicted + actual) > 0
    f1 = 2 * true_positive / (predicted + actual).clamp_min(1)
    return {
        "accuracy": float(true_positive.sum() / labels.numel()),
        "f1": float(f1[seen].mean()),
    }
