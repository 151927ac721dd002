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
        """``cos`` and ``sin`` ``[T, D]`` of positions ``offset .. offset + T - 1``, cut
        from a float32 table that grows to the longest run seen (built once, not per call:
        a packed batch rotates all its sequences with one lookup)."""
        cos, sin = self._table(offset + length, device)
        return cos[offset:offset + length].to(dtype), sin[offset:offset + length].to(dtype)

    def _table(self, length: int, device) -> tuple[Tensor, Tensor]:
        cached = getattr(self, "_cached", None)
        usable = (
            cached is not None
            and cached[0].shape[0] >= length
            and cached[0].device == torch.device(device)
            # a table made under inference_mode cannot be saved for a backward pass
            and (torch.is_inference_mode_enabled() or not cached[0].is_inference())
        )
        if not usable:
            rows = max(length, 2 * cached[0].shape[0] if cached is not None else 64)
            positions = torch.arange(rows, device=device, dtype=torch.float32)
            angles = torch.outer(positions, self.inv_freq.to(device))  # [T, D/2]
            angles = torch.cat((angles, angles), dim=-1)  # [T, D]
            self._cached = (angles.cos(), angles.sin())
        return self._cached

    def rotate_positions(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate rows at given positions: ``x`` ``[N, H, D]``, ``positions`` ``[N]`` ints.

        The packed layout's rotation (each real token at its place in its own sequence).
        """
        if x.dim() != 3 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [N, H, {self.head_dim}], got shape {tuple(x.shape)}")
        length = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = self._table(length, x.device)
        cos, sin = cos[positions].to(x.dtype)[:, None], sin[positions].to(x.dtype)[:, None]  # [N, 1, D]
        return _rotate(x, cos, sin)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [B, H, T, {self.head_dim}], got shape {tuple(x.shape)}")
        cos, sin = self._cos_sin(x.shape[2], offset, x.device, x.dtype)  # [T, D]
        return _rotate(x, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return x * cos + rotated * sin
