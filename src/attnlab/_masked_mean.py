"""The mean over the positions a padding mask marks real, used by every pooling step."""

from __future__ import annotations

from typing import Optional

from torch import Tensor

__all__ = ["masked_mean"]


def masked_mean(x: Tensor, mask: Optional[Tensor], *, keepdim: bool = True) -> Tensor:
    """Mean over dim 1 of the rows ``mask`` marks ``True``; zeros where none is.

    Args:
        x: values, e.g. hidden states.
        mask: ``True`` (or 1) on real positions; ``None`` averages every position.
        keepdim: keep dim 1 (``[B, 1, E]``, the default) or drop it (``[B, E]``).

    Shape:
        ``x`` ``[B, L, E]``, ``mask`` ``[B, L]`` -> ``[B, 1, E]`` (``[B, E]`` without ``keepdim``).
    """
    if mask is None:
        return x.mean(dim=1, keepdim=keepdim)
    weights = mask.to(x.dtype).unsqueeze(-1)  # [B, L, 1]
    count = weights.sum(dim=1, keepdim=keepdim).clamp_min(1.0)  # [B, 1] or [B, 1, 1]
    return (x * weights).sum(dim=1, keepdim=keepdim) / count
