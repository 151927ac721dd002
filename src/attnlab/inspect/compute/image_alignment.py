"""Text-token -> image-patch attention, scored against the ink of the image.

Dimension letters: ``H`` heads, ``T`` text tokens, ``S`` patches (row-major on a
``G x G`` grid), ``N`` images.

The reference for alignment is the set of patches that contain ink: a patch is inked
when any of its pixels reaches ``ink_threshold`` (pixels in ``[0, 1]``, ink high). A
statement about the image's digit should make the text look at the strokes, not at
the empty background.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from ...data.digits_text import DigitsTextExample, collate_digits_text
from .statistics import row_statistics

__all__ = [
    "AlignmentScore", "ink_patches", "patch_alignment", "patch_attention_map", "cross_attention_alignment",
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


def patch_alignment(
    weights: Tensor, reference: Tensor, query_mask: Optional[Tensor] = None
) -> AlignmentScore:
    """Attention mass that text tokens put on the reference patches, and its lift over uniform.

    One number for a whole set of maps; the per-head ``alignment_score`` statistic of
    :func:`~attnlab.inspect.compute.statistics.row_statistics` is the same mass per row.

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


@torch.no_grad()
def cross_attention_alignment(model, tokenizer, examples: Sequence[DigitsTextExample], *,
                              batch_size: int = 256) -> dict[str, dict]:
    """Per cross-modal layer and head: how much the text's attention lies on inked patches.

    The per-head figures are the inspection statistics ``alignment_score`` (attention
    mass on the reference patches) and ``alignment_argmax`` (how often the most attended
    patch is inked) of :func:`attnlab.inspect.compute.statistics.row_statistics`, with the
    inked patches of each image as every real token's reference; ``chance`` is the mass
    uniform attention would put there.

    Returns:
        ``{"layer_1": {"mass": .., "chance": .., "lift": .., "argmax": ..,
        "heads": {"alignment_score": [H], "alignment_argmax": [H]}}, ...}``.
    """
    model.eval()
    patch_size = model.config.patch_size
    sums: dict[str, dict[str, torch.Tensor]] = {}
    chance_total = rows_total = 0.0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = collate_digits_text(chunk, tokenizer)
        out = model(batch["input_ids"], batch["mask"], images=batch["images"], output_attentions=True)
        reference = ink_patches(batch["images"], patch_size)  # [B, S]
        B, S = reference.shape
        query_mask = batch["mask"]  # [B, T]
        chance = reference.float().mean(-1, keepdim=True).expand_as(query_mask)  # [B, T]
        chance_total += float(chance[query_mask].sum())
        rows_total += float(query_mask.sum())
        for name, weights in (out.cross_attentions or {}).items():
            values, rows = row_statistics(weights, query_mask, torch.ones(B, S, dtype=torch.bool),
                                          alignment=reference[:, None, :])
            totals = sums.setdefault(name, {})
            for statistic in ("alignment_score", "alignment_argmax"):
                counted = rows[statistic].double()  # [B, H, T]
                value = (values[statistic].double() * counted).sum((0, 2))  # [H]
                totals[statistic] = totals.get(statistic, 0) + value
                totals[statistic + "_rows"] = totals.get(statistic + "_rows", 0) + counted.sum((0, 2))
    chance = chance_total / max(rows_total, 1.0)
    result = {}
    for name, totals in sums.items():
        heads = {statistic: (totals[statistic] / totals[statistic + "_rows"].clamp_min(1)).tolist()
                 for statistic in ("alignment_score", "alignment_argmax")}
        mass = sum(heads["alignment_score"]) / len(heads["alignment_score"])
        result[name] = {
            "mass": mass,
            "chance": chance,
            "lift": mass / chance if chance else 0.0,
            "argmax": sum(heads["alignment_argmax"]) / len(heads["alignment_argmax"]),
            "heads": heads,
        }
    return result
