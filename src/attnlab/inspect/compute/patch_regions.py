"""How much of a vision transformer's attention falls on a region of the image (an object).

Dimension letters: ``H`` heads, ``gh x gw`` the patch grid, ``G = gh * gw`` patches.

A region is given as a pixel mask; :func:`patch_coverage` turns it into each patch's covered
share (0 to 1). The region's share of some attention over the patches is then
``sum_p a_p c_p / sum_p a_p``: the attention renormalised over the patches (the class
token's weight on itself and on other tokens before the patches is left out) and each patch
counted by how much of it the region covers. Attention spread evenly over the patches gets
exactly the region's share of the area, ``mean_p c_p``, which is the chance level to compare
with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

__all__ = ["ObjectShare", "patch_coverage", "region_share"]


@dataclass
class ObjectShare:
    """A region's share of the attention, against its share of the area.

    Attributes:
        per_head: ``[H]`` each head's share.
        fused: the share of the heads' mean map.
        area: the region's share of the patches' area (what even attention gives).
        rollout: the share of the class token's rollout row, where it was computed.
    """

    per_head: Tensor
    fused: float
    area: float
    rollout: Optional[float] = None
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"per_head": [round(float(v), 6) for v in self.per_head], "fused": self.fused,
                "rollout": self.rollout, "area": self.area, **self.settings}


def patch_coverage(mask, grid: tuple[int, int], patch_size: int) -> Tensor:
    """``[gh, gw]``: the share of each patch's pixels that ``mask`` covers.

    Args:
        mask: ``[height, width]`` bool (or 0/1) pixel mask, ``True`` on the region, of the image
            as the model saw it (after resizing: ``height = gh * patch_size``).
        grid: ``(gh, gw)``.
        patch_size: side of a patch in pixels.
    """
    mask = torch.as_tensor(mask)
    gh, gw = grid
    if mask.dim() != 2 or tuple(mask.shape) != (gh * patch_size, gw * patch_size):
        raise ValueError(f"mask must be [height, width] = [{gh * patch_size}, {gw * patch_size}] pixels (the "
                         f"{gh} x {gw} patches of {patch_size} px the model saw), got {tuple(mask.shape)}; resize "
                         f"the mask as the image was")
    pixels = mask.double().reshape(gh, patch_size, gw, patch_size)  # [gh, p, gw, p]
    return pixels.mean(dim=(1, 3))  # [gh, gw]


def region_share(attention: Tensor, coverage: Tensor) -> Tensor:
    """The region's share of each map of ``attention`` over the patches.

    Args:
        attention: ``[..., gh, gw]`` (or ``[..., G]``) non-negative weights over the patches.
        coverage: ``[gh, gw]`` from :func:`patch_coverage`.

    Returns:
        ``[...]``: ``sum_p a_p c_p / sum_p a_p`` for each map.
    """
    coverage = torch.as_tensor(coverage).double()
    G, grid_dims = coverage.numel(), coverage.dim()
    if attention.dim() >= grid_dims and tuple(attention.shape[-grid_dims:]) == tuple(coverage.shape):
        flat = attention.double().flatten(start_dim=attention.dim() - grid_dims)  # [..., G]
    elif attention.dim() >= 1 and attention.shape[-1] == G:
        flat = attention.double()  # [..., G]
    else:
        raise ValueError(f"attention must end in the {tuple(coverage.shape)} patch grid or its {G} patches, "
                         f"got {tuple(attention.shape)}")
    coverage = coverage.flatten()  # [G]
    total = flat.sum(-1)
    if bool((total <= 0).any()):
        raise ValueError("a map puts no weight on any patch; its share of a region is undefined")
    return (flat * coverage).sum(-1) / total
