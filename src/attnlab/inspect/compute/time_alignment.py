"""Tokens to times from cross-attention over audio: the matrix openai-whisper's ``find_alignment``
builds from its alignment heads, and dynamic time warping through it.

Dimension letters: ``A`` alignment heads, ``T`` decoder rows, ``P`` encoder positions of the clip.

:func:`alignment_matrix` takes each alignment head's cross-attention over the clip's positions only
(renormalised there: the same as a softmax over those positions alone), standardises each head's
weights per position over the rows (mean 0, variance 1 over ``T``, as whisper's ``std_mean(dim=-2)``),
median-filters them along time (width 7, reflected at the ends) and averages the heads.
:func:`dtw_path` is the monotone path from ``(0, 0)`` to ``(T - 1, P - 1)`` of least total cost,
with whisper's tie rule (diagonal first, then up, then left). Nothing here imports transformers.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["alignment_matrix", "dtw_path", "median_filter"]


def median_filter(values: np.ndarray, width: int) -> np.ndarray:
    """The running median of ``width`` (odd) along the last axis, reflected at both ends; ``values``
    shorter than ``width // 2 + 1`` come back unchanged (as whisper's)."""
    if width < 1 or width % 2 == 0:
        raise ValueError(f"width must be an odd int >= 1, got {width!r}")
    half = width // 2
    if values.shape[-1] <= half:
        return values
    padded = np.pad(values, [(0, 0)] * (values.ndim - 1) + [(half, half)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)  # [..., P, width]
    return np.median(windows, axis=-1)


def alignment_matrix(weights: Tensor, positions: int, *, median_width: int = 7) -> np.ndarray:
    """``[T, P]``: the heads' standardised, filtered cross-attention averaged (higher: more aligned).

    Args:
        weights: ``[A, T, S]`` softmax weights of the alignment heads over all ``S`` encoder positions.
        positions: the ``P <= S`` positions the clip covers (the rest is padding).
        median_width: the median filter's width along time (whisper's 7).
    """
    if weights.dim() != 3:
        raise ValueError(f"weights must be [heads, rows, positions], got {tuple(weights.shape)}")
    if not 1 <= positions <= weights.shape[-1]:
        raise ValueError(f"positions must lie in 1..{weights.shape[-1]}, got {positions}")
    clip = weights[..., :positions].double()  # [A, T, P]
    clip = clip / clip.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    std, mean = torch.std_mean(clip, dim=-2, keepdim=True, unbiased=False)  # over the rows
    standard = ((clip - mean) / std.clamp_min(1e-12)).numpy()
    return median_filter(standard, median_width).mean(axis=0)


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, columns)``: the least-cost monotone path through ``cost [T, P]``, from ``(0, 0)`` to
    ``(T - 1, P - 1)``, each step one down, one right or both. Runs in ``O(T P)``, one anti-diagonal
    at a time."""
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 2 or 0 in cost.shape:
        raise ValueError(f"cost must be a non-empty [rows, columns] matrix, got shape {cost.shape}")
    T, P = cost.shape
    total = np.full((T + 1, P + 1), np.inf)
    total[0, 0] = 0.0
    step = np.zeros((T + 1, P + 1), dtype=np.int8)  # 0 diagonal, 1 from above, 2 from the left
    for diagonal in range(2, T + P + 1):  # cells (i, j), 1-based, with i + j == diagonal
        i = np.arange(max(1, diagonal - P), min(T, diagonal - 1) + 1)
        j = diagonal - i
        previous = np.stack([total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]])  # [3, cells]
        # whisper's rule: the diagonal if strictly least, else above if strictly least, else the left
        choice = np.where((previous[0] < previous[1]) & (previous[0] < previous[2]), 0,
                          np.where((previous[1] < previous[0]) & (previous[1] < previous[2]), 1, 2))
        total[i, j] = cost[i - 1, j - 1] + previous[choice, np.arange(len(i))]
        step[i, j] = choice
    step[0, :], step[:, 0] = 2, 1  # the edges lead back to (0, 0); the walk never enters them otherwise
    rows, columns, i, j = [], [], T, P
    while i > 0 or j > 0:
        rows.append(i - 1)
        columns.append(j - 1)
        move = step[i, j]
        i, j = (i - 1, j - 1) if move == 0 else (i - 1, j) if move == 1 else (i, j - 1)
    return np.array(rows[::-1]), np.array(columns[::-1])
