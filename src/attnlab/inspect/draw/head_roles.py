"""A layers x heads picture of one head role's scores (:mod:`~attnlab.inspect.compute.head_roles`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

__all__ = ["plot_head_role"]


def plot_head_role(scores: Sequence[Sequence[float]], role: str, *, title: str = "") -> Figure:
    """Layers (rows, layer 1 at the top) x heads (columns), each cell its score in [0, 1], written in it.

    Args:
        scores: ``[L][H]`` one role's scores.
        role: its name, for the title.
        title: what comes before the role in the title (the model's name).
    """
    matrix = np.asarray(scores, dtype=np.float64)  # [L, H]
    if matrix.ndim != 2 or not matrix.size:
        raise ValueError(f"scores must be [L, H], got shape {matrix.shape}")
    L, H = matrix.shape
    figure = Figure(figsize=(max(4.0, 0.55 * H + 2.0), max(3.0, 0.4 * L + 1.4)))
    axes = figure.add_subplot()
    image = axes.imshow(matrix, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=8)
    axes.set_yticks(range(L), [str(layer + 1) for layer in range(L)], fontsize=8)
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    if L * H <= 400:
        for layer in range(L):
            for head in range(H):
                value = matrix[layer, head]
                axes.text(head, layer, "–" if np.isnan(value) else f"{value:.2f}", ha="center", va="center",
                          fontsize=6, color="white" if not np.isnan(value) and value < 0.6 else "black")
    axes.set_title(f"{title + ': ' if title else ''}{role} score per head", fontsize=10)
    figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    return figure
