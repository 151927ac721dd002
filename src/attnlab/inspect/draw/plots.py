"""Attention heatmaps: one head, one layer's heads, the whole model; PNG and SVG.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` query length, ``S`` key length.

Figures are built with :class:`matplotlib.figure.Figure` directly, never through
``pyplot``: nothing is shown, no global figure state is kept, and it runs headless.

Long inputs stay readable and fast in two ways:

* ``window=(start, stop)`` shows only positions ``start..stop-1`` on both axes;
* past ``max_tokens`` positions, neighbouring positions are pooled into buckets: query
  rows are averaged and key columns summed, so every row of the picture still sums to
  the attention mass it had, and labels name the bucket's position range.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

__all__ = ["bucket_attention", "plot_head", "plot_layer", "plot_model", "plot_statistic", "save_figure"]

ArrayLike = Union[Tensor, np.ndarray]
CMAP = "viridis"

logger = logging.getLogger(__name__)
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from")


def _numpy(weights: ArrayLike) -> np.ndarray:
    if isinstance(weights, Tensor):
        return weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=np.float32)


def _bucket_starts(length: int, max_tokens: int) -> np.ndarray:
    # even split: bucket sizes differ by at most one position
    count = min(length, max_tokens)
    return (np.arange(count) * length) // count


def bucket_attention(
    weights: ArrayLike,
    tokens: Sequence[str],
    key_tokens: Optional[Sequence[str]] = None,
    *,
    window: Optional[tuple[int, int]] = None,
    max_tokens: int = 128,
) -> tuple[np.ndarray, list[str], list[str]]:
    """Cut a window and pool long maps into at most ``max_tokens`` buckets per axis.

    Args:
        weights: one attention map.
        tokens: query token strings (length ``T``).
        key_tokens: key token strings (length ``S``); default ``tokens``.
        window: ``(start, stop)`` positions kept on both axes.
        max_tokens: most rows/columns drawn; beyond it rows are averaged and columns
            summed over buckets of neighbouring positions.

    Returns:
        ``(matrix, query_labels, key_labels)``; a bucket's label is ``"start-stop"``.

    Shape:
        ``weights`` ``[T, S]`` -> ``matrix`` ``[<= max_tokens, <= max_tokens]``.
    """
    matrix = _numpy(weights)
    if matrix.ndim != 2:
        raise ValueError(f"weights must be one map [T, S], got shape {matrix.shape}")
    T, S = matrix.shape
    key_tokens = list(tokens if key_tokens is None else key_tokens)
    tokens = list(tokens)
    if len(tokens) != T or len(key_tokens) != S:
        raise ValueError(f"need {T} query and {S} key tokens, got {len(tokens)} and {len(key_tokens)}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    offset_q = offset_k = 0
    if window is not None:
        start, stop = window
        if not 0 <= start < stop:
            raise ValueError(f"window must be (start, stop) with 0 <= start < stop, got {window}")
        matrix = matrix[start:stop, start:stop]
        tokens, key_tokens = tokens[start:stop], key_tokens[start:stop]
        offset_q = offset_k = start
    labels_q = [str(token) for token in tokens]
    labels_k = [str(token) for token in key_tokens]
    if matrix.shape[0] > max_tokens:
        starts = _bucket_starts(matrix.shape[0], max_tokens)
        sizes = np.diff(np.append(starts, matrix.shape[0]))
        matrix = np.add.reduceat(matrix, starts, axis=0) / sizes[:, None]  # mean over query rows
        labels_q = [f"{offset_q + a}-{offset_q + a + n - 1}" for a, n in zip(starts, sizes)]
    if matrix.shape[1] > max_tokens:
        starts = _bucket_starts(matrix.shape[1], max_tokens)
        sizes = np.diff(np.append(starts, matrix.shape[1]))
        matrix = np.add.reduceat(matrix, starts, axis=1)  # attention mass per key bucket
        labels_k = [f"{offset_k + a}-{offset_k + a + n - 1}" for a, n in zip(starts, sizes)]
    return matrix, labels_q, labels_k


def _scale_top(matrices: Sequence[np.ndarray]) -> float:
    """Top of the colour scale: the largest weight drawn, so a long map shows its structure.

    A map over hundreds of keys holds weights near ``1 / S``; on a fixed 0..1 scale it is one
    dark block. The colour bar gives the scale's values, so the picture stays honest.
    """
    finite = [float(np.nanmax(matrix)) for matrix in matrices if matrix.size and np.isfinite(matrix).any()]
    top = max(finite, default=1.0)
    return top if top > 0 else 1.0


def _draw_map(
    ax, matrix: np.ndarray, labels_q: Sequence[str], labels_k: Sequence[str], *, ticks: int, vmax=None
):
    image = ax.imshow(matrix, cmap=CMAP, vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
    for axis_labels, set_ticks, set_labels, rotation in (
        (labels_k, ax.set_xticks, ax.set_xticklabels, 90),
        (labels_q, ax.set_yticks, ax.set_yticklabels, 0),
    ):
        if ticks <= 0:
            set_ticks([])
            continue
        step = max(1, math.ceil(len(axis_labels) / ticks))
        positions = list(range(0, len(axis_labels), step))
        set_ticks(positions)
        # parse_math=False: a token such as "$x$" is text, not a formula
        set_labels([axis_labels[i] for i in positions], rotation=rotation, fontsize=7, parse_math=False)
    return image


def plot_head(
    weights: ArrayLike,
    tokens: Sequence[str],
    *,
    key_tokens: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
    window: Optional[tuple[int, int]] = None,
    max_tokens: int = 128,
    max_ticks: int = 48,
) -> Figure:
    """Heatmap of one head with token labels (rows: queries, columns: keys).

    The colour scale runs from 0 to the map's largest (pooled) weight, given by the bar.

    Args:
        weights: one head's attention map.
        tokens: query tokens; ``key_tokens`` for cross-attention.
        title: figure title.
        window, max_tokens: see :func:`bucket_attention`.
        max_ticks: most labels per axis (every n-th label beyond it).

    Shape:
        ``weights`` ``[T, S]``.
    """
    matrix, labels_q, labels_k = bucket_attention(
        weights, tokens, key_tokens, window=window, max_tokens=max_tokens
    )
    side = min(12.0, 3.0 + 0.12 * max(len(labels_q), len(labels_k)))
    figure = Figure(figsize=(side + 1.2, side))
    ax = figure.add_subplot()
    image = _draw_map(ax, matrix, labels_q, labels_k, ticks=max_ticks, vmax=_scale_top([matrix]))
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title, parse_math=False)
    figure.colorbar(image, ax=ax, shrink=0.8, label=_bar_label(matrix.shape, len(tokens), key_tokens, window))
    return figure


def _bar_label(shape: tuple[int, ...], T: int, key_tokens, window) -> str:
    pooled_keys = window is None and shape[1] < (T if key_tokens is None else len(key_tokens))
    return "attention (summed over each key bucket)" if pooled_keys else "attention"


def plot_layer(
    weights: ArrayLike,
    tokens: Sequence[str],
    *,
    key_tokens: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
    window: Optional[tuple[int, int]] = None,
    max_tokens: int = 64,
) -> Figure:
    """One layer's heads as a grid of heatmaps (labels on the left column and bottom row).

    The heads share one colour scale, from 0 to the layer's largest (pooled) weight.

    Shape:
        ``weights`` ``[H, T, S]``.
    """
    stack = _numpy(weights)
    if stack.ndim != 3:
        raise ValueError(f"weights must be [H, T, S], got shape {stack.shape}")
    H = stack.shape[0]
    columns = math.ceil(math.sqrt(H))
    rows = math.ceil(H / columns)
    figure = Figure(figsize=(2.6 * columns + 1.0, 2.6 * rows + 0.6))
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    pooled = [bucket_attention(head, tokens, key_tokens, window=window, max_tokens=max_tokens) for head in stack]
    top = _scale_top([matrix for matrix, _, _ in pooled])  # one scale for the layer: heads compare
    for index, ax in enumerate(axes.flat):
        if index >= H:
            ax.set_axis_off()
            continue
        matrix, labels_q, labels_k = pooled[index]
        ticks = 24 if len(labels_q) <= 24 else 8
        image = _draw_map(
            ax,
            matrix,
            labels_q if index % columns == 0 else [],
            labels_k if index // columns == rows - 1 else [],
            ticks=ticks,
            vmax=top,
        )
        ax.set_title(f"head {index + 1}", fontsize=9)
    if title:
        figure.suptitle(title, parse_math=False)
    if image is not None:
        figure.colorbar(image, ax=axes, shrink=0.6, label=_bar_label(pooled[0][0].shape, len(tokens), key_tokens,
                                                                    window))
    return figure


def plot_model(
    attentions: Mapping[str, ArrayLike],
    *,
    title: Optional[str] = None,
    tile_tokens: int = 48,
) -> Figure:
    """The whole model at a glance: a layers x heads mosaic drawn as one image.

    Each tile is one head (pooled to at most ``tile_tokens`` positions per axis) scaled
    to its own maximum, so faint and sharp heads are both visible; one ``imshow`` keeps
    it fast for large models.

    Args:
        attentions: ``{"layer_1": [H, T, S], ...}`` (one example).
        title: figure title.
        tile_tokens: positions per tile axis before pooling.
    """
    names = list(attentions.keys())
    if not names:
        raise ValueError("attentions is empty")
    tiles = []
    for name in names:
        stack = _numpy(attentions[name])
        if stack.ndim != 3:
            raise ValueError(f"{name} must be [H, T, S] (one example), got shape {stack.shape}")
        row = []
        for head in stack:
            fake = [""] * head.shape[0]
            matrix, _, _ = bucket_attention(head, fake, [""] * head.shape[1], max_tokens=tile_tokens)
            row.append(matrix / max(float(matrix.max()), 1e-12))
        tiles.append(row)
    L, H = len(tiles), max(len(row) for row in tiles)
    th = max(tile.shape[0] for row in tiles for tile in row)
    tw = max(tile.shape[1] for row in tiles for tile in row)
    gap = max(1, th // 12)
    mosaic = np.full((L * (th + gap) - gap, H * (tw + gap) - gap), np.nan, dtype=np.float32)
    for r, row in enumerate(tiles):
        for c, tile in enumerate(row):
            top, left = r * (th + gap), c * (tw + gap)
            mosaic[top : top + tile.shape[0], left : left + tile.shape[1]] = tile
    figure = Figure(figsize=(min(2 + 1.1 * H, 20), min(1.5 + 1.1 * L, 20)))
    ax = figure.add_subplot()
    image = ax.imshow(mosaic, cmap=CMAP, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(
        [c * (tw + gap) + tw / 2 for c in range(H)], [f"head {c + 1}" for c in range(H)], fontsize=7
    )
    ax.set_yticks([r * (th + gap) + th / 2 for r in range(L)], names, fontsize=7, parse_math=False)
    ax.set_title(
        title or "attention per layer and head (each tile scaled to its maximum)",
        fontsize=10,
        parse_math=False,
    )
    figure.colorbar(image, ax=ax, shrink=0.8, label="weight / the head's largest weight")
    return figure


def plot_statistic(matrix: ArrayLike, name: str, *, layers: Optional[Sequence[str]] = None) -> Figure:
    """A layers x heads table of one statistic, values written in the cells.

    The colour scale starts at 0 for a statistic that cannot be negative (0..1 for shares
    and normalised values), so that heads that differ by a hair are not drawn as opposite
    ends of the scale; the cells carry as many decimals as tell the values apart.

    Shape:
        ``matrix`` ``[L, H]`` (NaN where missing).
    """
    values = _numpy(matrix)
    L, H = values.shape
    finite = values[np.isfinite(values)]
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    vmin, vmax = (0.0 if low >= 0 else low), (1.0 if 0 <= low and high <= 1 else high)
    if vmax <= vmin:
        vmax = vmin + 1.0
    spread = high - low
    decimals = 2 if spread <= 0 or spread >= 0.1 else min(5, 1 + int(np.ceil(-np.log10(spread))))
    figure = Figure(figsize=(min(1.5 + 0.6 * H, 16), min(1.0 + 0.45 * L, 12)))
    ax = figure.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap=CMAP, aspect="auto", interpolation="nearest",
                      vmin=vmin, vmax=vmax)
    ax.set_xticks(range(H), [str(h + 1) for h in range(H)], fontsize=8)
    ax.set_yticks(
        range(L), list(layers) if layers is not None else [f"layer_{l + 1}" for l in range(L)], fontsize=8
    )
    ax.set_xlabel("head")
    ax.set_title(name)
    if L * H <= 400:
        middle = (vmin + vmax) / 2
        for l in range(L):
            for h in range(H):
                if np.isfinite(values[l, h]):
                    ax.text(
                        h,
                        l,
                        f"{values[l, h]:.{decimals}f}",
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="black" if values[l, h] > middle else "white",
                    )
    figure.colorbar(image, ax=ax, shrink=0.8, label=name)
    return figure


def save_figure(
    figure: Figure, path: Union[str, Path], formats: Sequence[str] = ("png",), dpi: int = 110
) -> list[Path]:
    """Save ``figure`` as ``path`` with each suffix in ``formats`` (``"png"``, ``"svg"``).

    Returns:
        the written paths.
    """
    allowed = {"png", "svg", "pdf"}
    path = Path(path)
    written = []
    for fmt in formats:
        if fmt not in allowed:
            raise ValueError(f"formats must be among {sorted(allowed)}, got {fmt!r}")
        target = path.with_suffix(f".{fmt}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # a tight box instead of a layout engine: labels never cut off, and it draws faster
            figure.savefig(target, format=fmt, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
        _report_warnings(caught, target)
        written.append(target)
    return written


def _report_warnings(caught: list, target: Path) -> None:
    """matplotlib warns once per character its font lacks (many lines for a text in another
    script): one line says so instead; other warnings pass on as they came."""
    glyphs = set()
    for warning in caught:
        found = _MISSING_GLYPH.search(str(warning.message))
        if found:
            glyphs.add(chr(int(found.group(1))))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if glyphs:
        logger.warning("%s: %d character(s) have no glyph in matplotlib's font and show as boxes (%s); the HTML "
                       "page shows them", target.name, len(glyphs), " ".join(sorted(glyphs)[:8]))
