"""Text-token -> image-patch attention: drawn over the image, and scored against the ink.

Dimension letters: ``H`` heads, ``T`` text tokens, ``S`` patches (row-major on a
``G x G`` grid), ``N`` images.

The reference for alignment is the set of patches that contain ink: a patch is inked
when any of its pixels reaches ``ink_threshold`` (pixels in ``[0, 1]``, ink high). A
statement about the image's digit should make the text look at the strokes, not at
the empty background.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "AlignmentScore",
    "ink_patches",
    "alignment_score",
    "patch_attention_map",
    "plot_text_to_image_attention",
]


class AlignmentScore(NamedTuple):
    """How much attention falls on the reference patches.

    Attributes:
        mass: mean attention mass on reference patches, in ``[0, 1]``.
        chance: the mass uniform attention would give (share of reference patches).
        lift: ``mass / chance``; 1 is no better than uniform, 0 when there is no reference.
    """

    mass: float
    chance: float
    lift: float


def ink_patches(images: Tensor, patch_size: int, ink_threshold: float = 0.25) -> Tensor:
    """Which patches contain ink.

    Shape:
        ``images`` ``[N, G * patch_size, G * patch_size]`` (or one image without ``N``)
        -> ``[N, S]`` bool (or ``[S]``), row-major.
    """
    single = images.dim() == 2
    if single:
        images = images.unsqueeze(0)
    if images.dim() != 3 or images.shape[1] % patch_size or images.shape[2] % patch_size:
        raise ValueError(
            f"images must be [N, height, width] with sides divisible by patch_size={patch_size}, "
            f"got shape {tuple(images.shape)}"
        )
    N, height, width = images.shape
    grid = images.reshape(N, height // patch_size, patch_size, width // patch_size, patch_size)
    inked = grid.amax(dim=(2, 4)) >= ink_threshold  # [N, rows, cols]
    inked = inked.reshape(N, -1)  # [N, S]
    return inked[0] if single else inked


def alignment_score(weights: Tensor, reference: Tensor, query_mask: Optional[Tensor] = None) -> AlignmentScore:
    """Attention mass that text tokens put on the reference patches.

    Args:
        weights: attention over patches, ``[..., T, S]`` (e.g. ``[N, H, T, S]``); rows
            sum to 1 (or 0 for rows that could attend nothing).
        reference: ``[N, S]`` or ``[S]`` bool, ``True`` on reference patches.
        query_mask: ``[N, T]`` bool, ``True`` on the tokens to count (e.g. real tokens,
            or only the word that names the digit); ``None`` counts every token.

    Returns:
        :class:`AlignmentScore`, averaged over images, heads and counted tokens.
    """
    if weights.dim() < 2:
        raise ValueError(f"weights must be [..., T, S], got shape {tuple(weights.shape)}")
    S = weights.shape[-1]
    if reference.shape[-1] != S:
        raise ValueError(f"reference must end in S={S} patches, got shape {tuple(reference.shape)}")
    weights = weights.detach().float()
    if weights.dim() == 4:  # [N, H, T, S]
        N, H, T, _ = weights.shape
        reference = reference.expand(N, S).bool()[:, None, None, :]  # [N, 1, 1, S]
        counted = torch.ones(N, 1, T) if query_mask is None else query_mask.bool()[:, None, :].float()
        counted = counted.expand(N, H, T)  # [N, H, T]
    else:
        reference = reference.bool()
        counted = torch.ones(weights.shape[:-1]) if query_mask is None else query_mask.float().expand(
            weights.shape[:-1])
    mass_per_row = (weights * reference).sum(-1)  # [..., T]
    total = counted.sum().clamp_min(1.0)
    mass = float((mass_per_row * counted).sum() / total)
    chance_per_row = reference.float().mean(-1).expand_as(mass_per_row)  # [..., T]
    chance = float((chance_per_row * counted).sum() / total)
    return AlignmentScore(mass, chance, mass / chance if chance > 0 else 0.0)


def patch_attention_map(weights: Tensor, grid_size: int, patch_size: int) -> np.ndarray:
    """Spread attention over patches ``[..., S]`` back to pixels ``[..., height, width]``."""
    grid = weights.detach().float().reshape(*weights.shape[:-1], grid_size, grid_size)  # [..., G, G]
    pixels = grid.repeat_interleave(patch_size, dim=-2).repeat_interleave(patch_size, dim=-1)
    return pixels.numpy()


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

    One row per token, one column per head plus the head average; each panel shows the
    image in grey with the attention in colour over it. Inked reference patches, when
    given, are outlined in the left-most column.

    Args:
        image: ``[height, width]`` pixels in ``[0, 1]``.
        weights: ``[H, T, S]`` text-token -> patch attention of one example.
        tokens: the ``T`` token strings (padding already dropped from ``weights``).
        path: where to write the PNG.
        patch_size: side of a patch in pixels.
        title: figure title.
        reference: ``[S]`` bool reference patches to outline.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

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
    figure, axes = plt.subplots(T, H + 1, figsize=(1.6 * (H + 1), 1.6 * T + 0.4), squeeze=False)
    for row, token in enumerate(tokens):
        for column in range(H + 1):
            axis = axes[row][column]
            axis.imshow(image.numpy(), cmap="gray_r", vmin=0, vmax=1)
            axis.imshow(maps[column, row], cmap="inferno", alpha=0.55, vmin=0, vmax=max(float(panels[column, row].max()), 1e-6))
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
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
