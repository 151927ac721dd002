"""Patch maps laid over the image they came from (PNG, Agg canvas).

Dimension letters: ``H`` heads, ``gh x gw`` the patch grid.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_patch_overlay", "plot_word_overlays"]


def _upsample(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """Each patch's value over its pixels (nearest: the patch edges stay visible)."""
    rows = (np.arange(height) * grid.shape[0]) // height
    columns = (np.arange(width) * grid.shape[1]) // width
    return grid[rows][:, columns]


def plot_patch_overlay(
    image: np.ndarray,
    maps: np.ndarray,
    path: Union[str, Path],
    *,
    titles: Optional[Sequence[str]] = None,
    title: Optional[str] = None,
    columns: Optional[int] = None,
) -> Path:
    """Draw each ``[gh, gw]`` map over ``image``, one panel per map, to a PNG.

    Each panel is scaled to its own maximum (colour bar: 0 .. that maximum); a panel with
    nothing above zero says so in its title (rollout with a high discard ratio can leave the
    class token nothing but itself). The figure's title is wrapped to the panels' width.

    Args:
        image: ``[height, width, 3]`` RGB in ``[0, 1]`` (what the model saw).
        maps: ``[M, gh, gw]`` non-negative values per patch.
        path: the PNG written.
        titles: one per panel.
        title: the figure's title.
        columns: panels per row (default all in one row, at most 6).
    """
    maps = np.asarray(maps, dtype=np.float32)
    image = np.asarray(image, dtype=np.float32)
    if maps.ndim != 3:
        raise ValueError(f"maps must be [M, gh, gw], got shape {maps.shape}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be [height, width, 3], got shape {image.shape}")
    count = maps.shape[0]
    columns = columns or min(count, 6)
    rows = -(-count // columns)
    height, width = image.shape[:2]
    figure = Figure(figsize=(2.4 * columns, 2.4 * rows * height / width + 0.5 * bool(title)))
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index in range(rows * columns):
        axis = axes[index // columns][index % columns]
        axis.set_xticks([])
        axis.set_yticks([])
        if index >= count:
            axis.axis("off")
            continue
        empty = not float(maps[index].max()) > 0.0
        top = 1.0 if empty else float(maps[index].max())
        axis.imshow(image)
        shown = axis.imshow(_upsample(maps[index], height, width), cmap="inferno", alpha=0.6, vmin=0, vmax=top)
        figure.colorbar(shown, ax=axis, fraction=0.046, pad=0.02).ax.tick_params(labelsize=6)
        if titles is not None or empty:
            name = titles[index] if titles is not None else ""
            axis.set_title(f"{name} (all zero)" if empty else name, fontsize=8)
    if title:
        figure.suptitle(textwrap.fill(title, width=max(28, 34 * columns)), fontsize=9)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def plot_word_overlays(
    picture: np.ndarray,
    words: Sequence[str],
    maps: Sequence[dict[str, np.ndarray]],
    path: Union[str, Path],
    *,
    shares: Optional[Sequence[float]] = None,
    title: Optional[str] = None,
    tiles: Optional[tuple[int, int]] = None,
) -> Path:
    """What each generated word looked at: one row per word, one panel per kind of map.

    Args:
        picture: ``[height, width, 3]`` in ``[0, 1]``: the picture the model saw.
        words: the generated tokens, one row each.
        maps: per word, ``{kind: [gh, gw]}`` maps over the whole picture (``tiles``: every tile's
            grid in its place; ``whole image``), each panel scaled to its own maximum.
        path: the PNG written.
        shares: per word, the share of its attention on the image, shown beside the word.
        title: the figure's title.
        tiles: ``(rows, columns)`` of the tiles the picture was cut into, outlined on the
            ``tiles`` panels.
    """
    picture = np.asarray(picture, dtype=np.float32)
    if len(words) != len(maps) or not words:
        raise ValueError(f"one map per word: {len(words)} words, {len(maps)} maps")
    kinds = list(maps[0])
    height, width = picture.shape[:2]
    panel = 2.4
    figure = Figure(figsize=(panel * len(kinds) * max(1.0, width / height) + 1.2,
                             panel * len(words) + 0.5 * bool(title)))
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(words), len(kinds), squeeze=False)
    for row, (word, kinds_maps) in enumerate(zip(words, maps)):
        for column, kind in enumerate(kinds):
            axis = axes[row][column]
            axis.set_xticks([])
            axis.set_yticks([])
            grid = np.asarray(kinds_maps[kind], dtype=np.float32)
            top = float(grid.max()) if float(grid.max()) > 0 else 1.0
            axis.imshow(picture)
            axis.imshow(_upsample(grid, height, width), cmap="inferno", alpha=0.6, vmin=0, vmax=top)
            if kind == "tiles" and tiles is not None:
                for line in range(1, tiles[0]):
                    axis.axhline(line * height / tiles[0] - 0.5, color="cyan", linewidth=0.8)
                for line in range(1, tiles[1]):
                    axis.axvline(line * width / tiles[1] - 0.5, color="cyan", linewidth=0.8)
            if row == 0:
                axis.set_title(kind, fontsize=8)
            if column == 0:
                label = repr(word)[1:-1] if word.strip() else repr(word)
                if shares is not None:
                    label += f"\n{shares[row]:.0%} on image"
                axis.set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center")
    if title:
        figure.suptitle(textwrap.fill(title, width=max(40, 40 * len(kinds))), fontsize=9)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path
