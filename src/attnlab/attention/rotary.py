"""Rotary position embedding, an option of the attention modules.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head dim.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import check_positive_int

__all__ = ["RotaryEmbedding"]



class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021) applied to queries and keys.

    Rotates pairs ``(x[..., i], x[..., i + D/2])`` by an angle ``position * base^(-2i/D)``
    (the "rotate half" layout used by GPT-NeoX and LLaMA). It is relative: the dot
    product of a rotated query and key depends only on their distance.

    Args:
        head_dim: ``D``; must be even.
        base: frequency base.

    Shape:
        ``x``: ``[B, H, T, D]`` -> ``[B, H, T, D]``.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, *, device=None) -> None:
        super().__init__()
        check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [D/2]

    def _cos_sin(self, length: int, offset: int, device, dtype) -> tuple[Tensor, Tensor]:
        positions = torch.arange(offset, offset + length, device=device, dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq.to(device))  # [T, D/2]
        angles = torch.cat((angles, angles), dim=-1)  # [T, D]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [B, H, T, {self.head_dim}], got shape {tuple(x.shape)}")
        cos, sin = self._cos_sin(x.shape[2], offset, x.device, x.dtype)  # [T, D]
        first, second = x.chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)  # [B, H, T, D]
        return x * cos + rotated * sin
