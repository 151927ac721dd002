"""The logit lens as a picture: layers x positions, coloured by the followed token's probability.

Dimension letters: ``L`` layers (+ the embeddings), ``Q`` read positions.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

__all__ = ["plot_logit_lens", "visible_token"]


def visible_token(token: str) -> str:
    """Whitespace made visible, as the pages show it: newline ``↵``, tab ``⇥``, space ``·``."""
    return str(token).replace("\n", "\u21b5").replace("\t", "\u21e5").replace(" ", "\u00b7")


def plot_logit_lens(
    probabilities: Sequence[Sequence[float]], top_tokens: Sequence[Sequence[str]], layers: Sequence[str],
    columns: Sequence[str], *, title: str = "", colour_label: Optional[str] = None,
) -> Figure:
    """Rows: the embeddings then every layer (the last at the top); columns: read positions.

    Args:
        probabilities: ``[L + 1][Q]`` what colours a cell (the explained token's probability).
        top_tokens: ``[L + 1][Q]`` the most likely token after each layer, written in the cell.
        layers: ``L + 1`` row names.
        columns: ``Q`` column labels (the explained tokens).
        title: figure title.
        colour_label: what the colour is.
    """
    matrix = np.asarray(probabilities, dtype=np.float64)  # [L + 1, Q]
    rows, Q = matrix.shape
    figure = Figure(figsize=(max(5.0, 1.1 * Q + 2.5), max(3.0, 0.32 * rows + 1.5)))
    axes = figure.add_subplot()
    image = axes.imshow(matrix[::-1], cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_yticks(range(rows), list(layers)[::-1], fontsize=7)
    axes.set_xticks(range(Q), [str(c) for c in columns], rotation=45, ha="right", fontsize=8)
    for r in range(rows):
        for q in range(Q):
            token = visible_token(top_tokens[rows - 1 - r][q])
            token = token if len(token) <= 10 else token[:9] + "…"
            axes.text(q, r, token, ha="center", va="center", fontsize=6,
                      color="white" if matrix[rows - 1 - r, q] > 0.55 else "black")
    axes.set_title(title or "logit lens: the most likely next token after each layer", fontsize=10)
    bar = figure.colorbar(image, ax=axes, fraction=0.04, pad=0.02)
    bar.set_label(colour_label or "probability of the explained token", fontsize=8)
    return figure
