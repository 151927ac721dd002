"""Attention heatmaps: one head, one layer's heads, the whole model; PNG and SVG.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` query length, ``S`` key length.

Figures are built with :class:`matplotlib.figure.Figure` directly, never through
``pyplot``: nothing is shown, no global figure state is kept, and it runs headless.

Long inputs stay readable and fast in two ways:

* ``window=(start, stop)`` shows only positions ``start..stop-1`` on both axes;
* past ``max_tokens`` positions, neighbouring positions are pooled into buckets: query
  rows are averaged and key columns summed, so every row of the picture still sums to
  the attention mass it had, and labels name the bucket's position range.

A key axis that is time (a speech encoder's positions) is drawn in seconds instead:
``key_seconds`` (the seconds one key position covers) puts ticks at round seconds where
they fall among the pooled columns, under the title "time (s)".
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

__all__ = ["bucket_attention", "plot_head", "plot_layer", "plot_model", "plot_statistic", "save_figure",
           "time_ticks"]

ArrayLike = Union[Tensor, np.ndarray]
CMAP = "viridis"

logger = logging.getLogger(__name__)
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from")
# tick spacings in seconds: round numbers a reader counts in
_TIME_STEPS = (0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)


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


def time_ticks(
    S: int, columns: int, seconds_per_position: float, *, first: int = 0, most: int = 8
) -> tuple[list[float], list[str]]:
    """Ticks at round seconds on a key axis of ``S`` positions drawn as ``columns`` columns.

    Key position ``s`` starts at ``s * seconds_per_position`` seconds. The columns are
    :func:`bucket_attention`'s buckets, so a time lands inside its bucket in proportion to
    the positions before it; the axis ends at the last position's end.

    Args:
        S: key positions shown (after the window).
        columns: columns drawn (``S``, or fewer when pooled).
        seconds_per_position: the seconds one position covers (20 ms for Whisper).
        first: the first shown position (a window's start).
        most: most ticks; the spacing is the smallest round step that keeps to it.

    Returns:
        ``(x, labels)``: tick places in column coordinates and labels such as ``"0.5 s"``.

    Example:
        ``time_ticks(256, 64, 0.02)`` -> ticks at 0 s, 1 s, ..., 5 s.
    """
    if not (math.isfinite(seconds_per_position) and seconds_per_position > 0):
        raise ValueError(f"seconds_per_position must be a positive number of seconds, "
                         f"got {seconds_per_position}")
    if not 1 <= columns <= S:
        raise ValueError(f"columns must be between 1 and S = {S}, got {columns}")
    start, end = first * seconds_per_position, (first + S) * seconds_per_position
    tiny = 1e-9 * max(1.0, end)  # float slack: 5.12 s must not fall short of itself
    step = next((step for step in _TIME_STEPS
                 if math.floor((end + tiny) / step) - math.ceil((start - tiny) / step) + 1 <= most), None)
    if step is None:
        step = _TIME_STEPS[-1] * math.ceil((end - start) / (_TIME_STEPS[-1] * max(1, most - 1)))
    times = np.arange(math.ceil((start - tiny) / step), math.floor((end + tiny) / step) + 1) * step
    # column c covers positions edges[c]..edges[c + 1] and is drawn from c - 0.5 to c + 0.5
    edges = np.append(_bucket_starts(S, columns), S) + first
    x = np.interp(times / seconds_per_position, edges, np.arange(columns + 1) - 0.5)
    decimals = len(f"{step:g}".partition(".")[2])
    return x.tolist(), [f"{time:.{decimals}f} s" for time in times]


def _scale_top(matrices: Sequence[np.ndarray]) -> float:
    """Top of the colour scale: the largest weight drawn, so a long map shows its structure.

    A map over hundreds of keys holds weights near ``1 / S``; on a fixed 0..1 scale it is one
    dark block. The colour bar gives the scale's values, so the picture stays honest.
    """
    finite = [float(np.nanmax(matrix)) for matrix in matrices if matrix.size and np.isfinite(matrix).any()]
    top = max(finite, default=1.0)
    return top if top > 0 else 1.0


def _draw_map(
    ax, matrix: np.ndarray, labels_q: Sequence[str], labels_k: Sequence[str], *, ticks: int, vmax=None,
    key_time: Optional[tuple[list[float], list[str]]] = None,
):
    image = ax.imshow(matrix, cmap=CMAP, vmin=0.0, vmax=vmax, interpolation="nearest", aspect="auto")
    axes = [(labels_q, ax.set_yticks, ax.set_yticklabels, 0)]
    if key_time is None:
        axes.insert(0, (labels_k, ax.set_xticks, ax.set_xticklabels, 90))
    elif labels_k:  # the time axis: round seconds where they fall, upright (few and short)
        ax.set_xticks(key_time[0], key_time[1], fontsize=7)
        ax.set_xlabel("time (s)", fontsize=8)
    else:
        ax.set_xticks([])
    for axis_labels, set_ticks, set_labels, rotation in axes:
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
    key_seconds: Optional[float] = None,
) -> Figure:
    """Heatmap of one head with token labels (rows: queries, columns: keys).

    The colour scale runs from 0 to the map's largest (pooled) weight, given by the bar.

    Args:
        weights: one head's attention map.
        tokens: query tokens; ``key_tokens`` for cross-attention.
        title: figure title.
        window, max_tokens: see :func:`bucket_attention`.
        max_ticks: most labels per axis (every n-th label beyond it).
        key_seconds: the seconds one key position covers: the key axis is then time, ticked
            at round seconds (see :func:`time_ticks`) and titled "time (s)".

    Shape:
        ``weights`` ``[T, S]``.
    """
    matrix, labels_q, labels_k = bucket_attention(
        weights, tokens, key_tokens, window=window, max_tokens=max_tokens
    )
    side = min(12.0, 3.0 + 0.12 * max(len(labels_q), len(labels_k)))
    figure = Figure(figsize=(side + 1.2, side))
    ax = figure.add_subplot()
    S = len(tokens if key_tokens is None else key_tokens)
    key_time = _key_time(S, matrix.shape[1], window, key_seconds, most=12)
    image = _draw_map(ax, matrix, labels_q, labels_k, ticks=max_ticks, vmax=_scale_top([matrix]),
                      key_time=key_time)
    if key_time is None:
        ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title, parse_math=False)
    figure.colorbar(image, ax=ax, shrink=0.8, label=_bar_label(matrix.shape, len(tokens), key_tokens, window))
    return figure


def _key_time(S: int, columns: int, window, key_seconds: Optional[float], *, most: int):
    """:func:`time_ticks` of a key axis in seconds (``None``: keys are tokens)."""
    if key_seconds is None:
        return None
    first, stop = (0, S) if window is None else (window[0], min(window[1], S))
    return time_ticks(stop - first, columns, key_seconds, first=first, most=most)


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
    key_seconds: Optional[float] = None,
) -> Figure:
    """One layer's heads as a grid of heatmaps (labels on the left column and bottom row).

    The heads share one colour scale, from 0 to the layer's largest (pooled) weight.
    ``key_seconds`` (the seconds one key position covers) draws the key axis as time, as
    :func:`plot_head` does.

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
    S = len(tokens if key_tokens is None else key_tokens)
    key_time = _key_time(S, pooled[0][0].shape[1], window, key_seconds, most=6) if pooled else None
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
            key_time=key_time,
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
