"""Text-token -> image-patch attention drawn over the image (PNG, Agg canvas).

Dimension letters: ``H`` heads, ``T`` text tokens, ``S`` patches (row-major on a
``G x G`` grid).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import Tensor

from ..compute.image_alignment import patch_attention_map

__all__ = ["plot_text_to_image_attention", "text_to_image_attention_figure"]


def plot_text_to_image_attention(
    image: Union[Tensor, np.ndarray],
    weights: Tensor,
    tokens: Sequence[str],
    path: Union[str, Path],
    *,
    patch_size: int,
    title: Optional[str] = None,
    reference: Optional[Tensor] = None,
) -> Path:
    """Draw each token's attention over the image, per head and averaged, to a PNG.

    The picture is :func:`text_to_image_attention_figure`'s; the arguments are its, and
    ``path``, where the PNG goes.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    figure = text_to_image_attention_figure(image, weights, tokens, patch_size=patch_size, title=title,
                                            reference=reference)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path


def text_to_image_attention_figure(
    image: Union[Tensor, np.ndarray],
    weights: Tensor,
    tokens: Sequence[str],
    *,
    patch_size: int,
    title: Optional[str] = None,
    reference: Optional[Tensor] = None,
) -> Figure:
    """Each token's attention over the image, per head and averaged.

    One row per token, one column per head plus the head average; each panel shows the
    image in grey with the attention in colour over it, scaled to the panel's largest
    weight (the colour bar's 0..1). Inked reference patches, when given, are outlined in
    the left-most column.

    Args:
        image: ``[height, width]`` pixels in ``[0, 1]``.
        weights: ``[H, T, S]`` text-token -> patch attention of one example.
        tokens: the ``T`` token strings (padding already dropped from ``weights``).
        patch_size: side of a patch in pixels.
        title: figure title.
        reference: ``[S]`` bool reference patches to outline.
    """
    image = torch.as_tensor(image).detach().float()
    if weights.dim() != 3 or weights.shape[1] != len(tokens):
        raise ValueError(
            f"weights must be [H, T, S] with T={len(tokens)} tokens, got shape {tuple(weights.shape)}"
        )
    H, T, S = weights.shape
    grid_size = image.shape[0] // patch_size
    if grid_size * grid_size != S:
        raise ValueError(f"image {tuple(image.shape)} with patch_size={patch_size} has {grid_size ** 2} patches, "
                         f"weights have S={S}")
    panels = torch.cat([weights, weights.mean(0, keepdim=True)], dim=0)  # [H + 1, T, S]
    maps = patch_attention_map(panels, grid_size, patch_size)  # [H + 1, T, height, width]
    figure = Figure(figsize=(1.6 * (H + 1), 1.6 * T + 0.4))
    FigureCanvasAgg(figure)
    axes = figure.subplots(T, H + 1, squeeze=False)
    for row, token in enumerate(tokens):
        for column in range(H + 1):
            axis = axes[row][column]
            axis.imshow(image.numpy(), cmap="gray_r", vmin=0, vmax=1)
            top = max(float(panels[column, row].max()), 1e-6)
            overlay = axis.imshow(maps[column, row] / top, cmap="inferno", alpha=0.55, vmin=0, vmax=1)
            axis.set_xticks([])
            axis.set_yticks([])
            if row == 0:
                axis.set_title("mean" if column == H else f"head {column + 1}", fontsize=8)
            if column == 0:
                axis.set_ylabel(token, fontsize=8, rotation=0, ha="right", va="center")
                if reference is not None:
                    for index in torch.nonzero(reference.bool()).flatten().tolist():
                        r, c = divmod(index, grid_size)
                        axis.add_patch(Rectangle((c * patch_size - 0.5, r * patch_size - 0.5), patch_size,
                                                 patch_size, fill=False, edgecolor="cyan", linewidth=0.6))
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout(rect=(0.0, 0.0, 0.9, 1.0))
    bar = figure.colorbar(overlay, cax=figure.add_axes((0.92, 0.2, 0.02, 0.6)))
    bar.solids.set_alpha(1.0)
    bar.set_label("attention / the panel's largest", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    return figure
