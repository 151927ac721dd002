"""The optimizer, with weight decay only where it belongs."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["decay_parameter_groups", "build_optimizer"]

_NO_DECAY_MODULES = (nn.Embedding, nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm)


def decay_parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: Linear-style weight matrices (decayed) and everything else (not):
    biases, norm scales and embeddings (including a decoder tied to an embedding)."""
    no_decay: set[int] = set()
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            if isinstance(module, _NO_DECAY_MODULES) or name.endswith("bias") or parameter.dim() < 2:
                no_decay.add(id(parameter))
    decay, keep = [], []
    for parameter in model.parameters():  # parameters() yields each tied tensor once
        if parameter.requires_grad:
            (keep if id(parameter) in no_decay else decay).append(parameter)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module,
    learning_rate: float,
    *,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-9,
) -> torch.optim.Optimizer:
    """AdamW with the article's betas and eps; with ``weight_decay=0`` it is the article's Adam."""
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    return torch.optim.AdamW(
        decay_parameter_groups(model, weight_decay), lr=learning_rate, betas=betas, eps=eps, weight_decay=weight_decay
    )
