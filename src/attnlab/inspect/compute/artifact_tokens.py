"""Artifact tokens: a few patches whose outputs are far larger than the others'.

Darcet et al. (2023, "Vision Transformers Need Registers") find that large vision
transformers (DINOv2 ViT-L and up, DeiT-III, OpenCLIP) recycle a few low-information patches,
mostly in the background, as scratch space for global information: those tokens come out with
a norm several times the typical patch's, and the class token's attention piles onto them, so
attention maps show bright specks away from the object.

The criterion here is the norm, the defining trait: a patch is named when its output norm is at
least ``norm_ratio`` (default 2) times the median patch norm. The median stands for the typical
patch because outliers are few by definition and cannot move it. High attention alone names
nothing (an object's patches draw attention for a good reason); each named patch carries its
attention mass and that mass against an even share, ``1 / G``, so the two traits are read side
by side.

Dimension letters: ``gh x gw`` the patch grid, ``G = gh * gw`` patches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["ARTIFACT_CRITERION", "ArtifactToken", "find_artifact_tokens"]

ARTIFACT_CRITERION = "output norm >= {ratio:g} x the median patch norm (Darcet et al. 2023's high-norm tokens)"


@dataclass
class ArtifactToken:
    """One patch named as an artifact token.

    Attributes:
        row, column: its place on the patch grid (0-based, row-major).
        norm: its output norm; ``norm_ratio``: that over the median patch norm.
        attention: the attention mass it takes (the class token's, over the patches, heads
            averaged; ``None`` where none was given); ``attention_ratio``: that times ``G``
            (1 is an even share).
    """

    row: int
    column: int
    norm: float
    norm_ratio: float
    attention: Optional[float] = None
    attention_ratio: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def find_artifact_tokens(norms: Tensor, attention: Optional[Tensor] = None, *,
                         norm_ratio: float = 2.0) -> list[ArtifactToken]:
    """The patches whose output norm is at least ``norm_ratio`` times the median, largest first.

    Args:
        norms: ``[gh, gw]`` each patch's output norm.
        attention: ``[gh, gw]`` the attention mass each patch takes (optional, reported).
        norm_ratio: how many medians make an outlier (> 1). A grid of one patch names none: the
            patch is its own median.

    Example:
        ``find_artifact_tokens(seen.patch_norms, seen.class_token_maps()["layer_12"].mean(0))``
    """
    if not isinstance(norms, Tensor) or norms.dim() != 2 or norms.numel() < 1:
        raise ValueError(f"norms must be the patch grid's [gh, gw] norms, got {getattr(norms, 'shape', norms)}")
    if attention is not None and tuple(attention.shape) != tuple(norms.shape):
        raise ValueError(f"attention must be on the same {tuple(norms.shape)} grid as norms, "
                         f"got {tuple(attention.shape)}")
    if not norm_ratio > 1.0:
        raise ValueError(f"norm_ratio must be above 1 (a multiple of the median norm), got {norm_ratio!r}")
    norms = norms.double()
    median = float(norms.flatten().median())
    if median <= 0:
        raise ValueError("the median patch norm is 0; there is no typical patch to compare with")
    gh, gw = norms.shape
    share = None if attention is None else attention.double() / attention.double().sum().clamp_min(1e-30)
    found = []
    for index in torch.argsort(norms.flatten(), descending=True).tolist():
        row, column = divmod(index, gw)
        norm = float(norms[row, column])
        if norm < norm_ratio * median:
            break
        mass = None if share is None else float(share[row, column])
        found.append(ArtifactToken(row, column, norm, norm / median, mass,
                                   None if mass is None else mass * gh * gw))
    return found
