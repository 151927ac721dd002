"""Learning-rate schedules."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

__all__ = ["warmup_cosine_schedule", "WarmupCosine", "warmup_cosine_scheduler"]


def warmup_cosine_schedule(step: int, *, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> float:
    """The learning-rate multiplier at optimizer step ``step``.

    Linear warm-up from 0 to 1 over ``warmup_steps``, then a half cosine from 1 down to
    ``min_ratio`` at ``total_steps`` (the real length of the run, unlike the article's
    hard-coded 100000), then ``min_ratio``. When ``warmup_steps >= total_steps`` the run
    ends inside the warm-up.

    Example:
        >>> warmup_cosine_schedule(10, warmup_steps=10, total_steps=30)  # the peak
        1.0
        >>> warmup_cosine_schedule(20, warmup_steps=10, total_steps=30)  # cosine midpoint
        0.5
    """
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio must lie in [0, 1], got {min_ratio}")
    if step < warmup_steps:
        return step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupCosine:
    """:func:`warmup_cosine_schedule` as a picklable callable (its state is plain numbers,
    so ``LambdaLR.state_dict()`` stores it)."""

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> None:
        warmup_cosine_schedule(0, warmup_steps=warmup_steps, total_steps=total_steps, min_ratio=min_ratio)
        self.warmup_steps, self.total_steps, self.min_ratio = warmup_steps, total_steps, min_ratio

    def __call__(self, step: int) -> float:
        return warmup_cosine_schedule(
            step, warmup_steps=self.warmup_steps, total_steps=self.total_steps, min_ratio=self.min_ratio
        )


def warmup_cosine_scheduler(
    optimizer: Optimizer, *, warmup_steps: int, total_steps: int, min_ratio: float = 0.0
) -> LambdaLR:
    """A ``LambdaLR`` stepping :func:`warmup_cosine_schedule` once per optimizer step."""
    return LambdaLR(optimizer, WarmupCosine(warmup_steps, total_steps, min_ratio))
