"""How block-sparse attention lays out its blocks: flat ``[n, L, D]`` blocks, the
overlapping window views of keys and values, the bias each block's window needs.

Dimension letters as in :mod:`._block_window_kernel`: ``B`` batch, ``H`` heads, ``T``
sequence length, ``D`` head dim, ``L`` block size, ``N`` blocks per sequence, ``n = B * H * N``
blocks in all, ``W = (2 * window + 1) * L`` window keys of a block, ``G`` global keys.
"""

from __future__ import annotations

import bisect

import torch
from torch import Tensor

__all__ = ["BlockBias", "BlockWindows", "flat_blocks", "global_token_rows", "padded_blocks"]

_NEG_INF = float("-inf")


def padded_blocks(x: Tensor, blocks: int, block_size: int, margin: int) -> Tensor:
    """``[B, H, T, D]`` -> ``[margin + B * H * N + margin, L, D]``, zeros around ``x``."""
    B, H, T, D = x.shape
    n = B * H * blocks
    flat = x.new_empty(n + 2 * margin, block_size, D)
    flat[:margin].zero_()
    flat[margin + n :].zero_()
    body = flat[margin : margin + n].view(B, H, blocks * block_size, D)  # [B, H, N * L, D]
    body[:, :, T:].zero_()  # masked keys must still be finite: 0 * inf is NaN
    body[:, :, :T] = x
    return flat


def flat_blocks(x: Tensor, blocks: int, block_size: int) -> Tensor:
    """``[B, H, T, D]`` -> ``[n, L, D]``: a view when ``x`` already has that layout."""
    B, H, T, D = x.shape
    if x.is_contiguous() and T == blocks * block_size:
        return x.view(B * H * blocks, block_size, D)
    return padded_blocks(x, blocks, block_size, 0)


class BlockWindows:
    """The ``[W, D]`` key (or value) windows of blocks, as views wherever possible.

    A ``[B, H, N * L, D]`` contiguous input is read in place: block ``i``'s window is
    an overlapping strided view, for every block whose window lies inside the tensor
    (``[first, stop)``: all but the first and last ``window`` blocks of the batch). Other
    inputs are copied once, with ``window`` blocks of zeros on each side, so that every
    block has a view.
    """

    def __init__(self, source: Tensor, shift: int, count: int, window: int) -> None:
        _, self.L, self.D = source.shape
        self.source, self.shift, self.count = (
            source,
            shift,
            count,
        )  # window i starts at source block i + shift
        self.width = (2 * window + 1) * self.L
        self.first, self.stop = -shift, count + shift

    @classmethod
    def of(cls, x: Tensor, blocks: int, block_size: int, window: int) -> "BlockWindows":
        B, H, T, D = x.shape
        count = B * H * blocks
        if x.is_contiguous() and T == blocks * block_size:
            return cls(x.view(count, block_size, D), -window, count, window)  # read in place
        return cls(padded_blocks(x, blocks, block_size, window), 0, count, window)  # [w + n + w, L, D]

    def sequence(self, batch: int, heads: int) -> Tensor:
        """``[B * H, N * L, D]``: every head's keys (or values) in sequence order."""
        margin = self.shift + (self.width // self.L - 1) // 2  # the zero blocks before the first
        return self.source[margin : margin + self.count].view(batch * heads, -1, self.D)

    def view(self, start: int, stop: int) -> Tensor:
        """``[stop - start, W, D]`` windows of blocks ``[start, stop)`` inside ``[first, stop)``."""
        assert self.first <= start and stop <= self.stop
        origin = self.source[start + self.shift :]
        return origin.as_strided((stop - start, self.width, self.D), (self.L * self.D, self.D, 1))

    def windows(self, start: int, stop: int) -> Tensor:
        """``[c, W, D]`` windows of blocks ``[start, stop)``; a copy only at the batch edges."""
        if self.first <= start and stop <= self.stop:
            return self.view(start, stop)
        return self.gather(torch.arange(start, stop, device=self.source.device))

    def gather(self, blocks: Tensor) -> Tensor:
        """``[m, W, D]`` copies of the windows of ``blocks``.

        Rows outside the input are clamped to its edge: the bias removes them, and they
        are finite.
        """
        rows = ((blocks + self.shift) * self.L)[:, None] + torch.arange(
            self.width, device=blocks.device
        )  # [m, W]
        flat = self.source.view(-1, self.D)  # [rows, D]
        return flat[rows.clamp_(0, flat.shape[0] - 1)]  # [m, W, D]


class BlockBias:
    """Which blocks need their window bias, which have no window key, and the bias of each.

    Flat block ``i`` of ``[B, H, N]`` takes bias row ``(i // (H * N)) * N + i % N``: the
    heads share the key mask.
    """

    def __init__(self, window_bias: Tensor, heads: int, blocks: int) -> None:
        self.window_bias = window_bias
        sequences = window_bias.shape[0] // blocks  # B
        rows = torch.arange(window_bias.shape[0], device=window_bias.device)
        self.rows = rows.view(sequences, 1, blocks).expand(sequences, heads, blocks).reshape(-1)  # [n]
        self.row_biased = (window_bias != 0).any(dim=1)  # [B * N]
        needs_bias = self.row_biased[self.rows]  # [n]
        has_window_key = (window_bias != _NEG_INF).any(dim=1)  # [B * N]
        self.biased = needs_bias.nonzero().squeeze(1).tolist()  # sorted flat block indices
        self.no_window_key = (~has_window_key[self.rows]).nonzero().squeeze(1)  # [m] long

    @staticmethod
    def between(blocks: list[int], start: int, stop: int) -> list[int]:
        return blocks[bisect.bisect_left(blocks, start) : bisect.bisect_left(blocks, stop)]


def global_token_rows(blocks: Tensor, batch: int, heads: int, global_index: Tensor) -> Tensor:
    """``[B * H * N, L, D]`` blocks -> the global tokens' rows ``[B * H, G, D]`` (a copy)."""
    rows = blocks.view(batch, heads, -1, blocks.shape[-1])[:, :, global_index]  # [B, H, G, D]
    return rows.reshape(batch * heads, global_index.numel(), blocks.shape[-1])
