"""Pictures of the block-sparse attention pattern (PNG, headless).

Dimension letters: ``T`` sequence length, ``L`` block size, ``N`` number of blocks.
A cell is white where attention is forbidden and dark where it is allowed
(``True`` = may attend, attnlab's convention).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from ..._checks import check_positive_int
from .block_sparse import block_sparse_mask

__all__ = ["block_pattern_density", "draw_sparsity_pattern"]


def block_pattern_density(
    seq_len: int, block_size: int, window: int = 0, global_positions: Sequence[int] = ()
) -> Tensor:
    """Fraction of allowed (query, key) pairs in each (query block, key block) cell.

    Exact, and ``O(N * N)`` rather than ``O(T * T)``, so it works for any length.

    Returns:
        ``[N, N]`` float tensor in ``[0, 1]``.
    """
    L = block_size
    N = max(1, math.ceil(seq_len / L))
    sizes = torch.full((N,), float(L))
    sizes[-1] = seq_len - (N - 1) * L  # the last block may be short
    blocks = torch.arange(N)
    local = ((blocks[:, None] - blocks[None, :]).abs() <= window).float()  # [N, N]
    globals_per_block = torch.zeros(N)
    for position in sorted({p for p in global_positions if 0 <= p < seq_len}):
        globals_per_block[position // L] += 1
    rows, cols = globals_per_block[:, None], globals_per_block[None, :]
    # Pairs with a global query or a global key, counted once (inclusion-exclusion).
    global_pairs = rows * sizes[None, :] + cols * sizes[:, None] - rows * cols
    global_fraction = global_pairs / (sizes[:, None] * sizes[None, :])
    return torch.maximum(local, global_fraction)


def draw_sparsity_pattern(
    path: Union[str, Path],
    seq_len: int,
    block_size: int,
    window: int = 0,
    global_positions: Sequence[int] = (),
    *,
    global_summary: bool = False,
    max_cells: int = 1024,
    title: Optional[str] = None,
) -> Path:
    """Draw which keys each query may attend and save it as a PNG.

    Up to ``max_cells`` positions the picture is exact per (query, key) pair; for
    longer inputs each cell is one (query block, key block) pair shaded by the
    fraction of allowed pairs in it (see :func:`block_pattern_density`). Uses
    matplotlib's Agg canvas directly: nothing is shown, no global figure state.

    Args:
        path: where to write the PNG (parent directories are created).
        seq_len: ``T``.
        block_size: ``L``.
        window: neighbouring blocks attended on each side.
        global_positions: global tokens' positions.
        global_summary: mention the pooled summary in the title (it gives every query
            a context built from all keys, which is not a pairwise pattern).
        max_cells: longest length drawn per pair.
        title: overrides the generated title.

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_positive_int("seq_len", seq_len)
    check_positive_int("block_size", block_size)
    check_positive_int("max_cells", max_cells)
    if seq_len <= max_cells:
        image = block_sparse_mask(seq_len, block_size, window, global_positions).float()  # [T, T]
        unit = "position"
        density = float(image.mean())
    else:
        image = block_pattern_density(seq_len, block_size, window, global_positions)  # [N, N]
        unit = f"block of {block_size}"
        density = _allowed_fraction(seq_len, block_size, image)
    if title is None:
        count = len({p for p in global_positions if 0 <= p < seq_len})
        title = (
            f"T={seq_len}, block {block_size}, window ±{window}, "
            f"{count} global token{'' if count == 1 else 's'}: {100 * density:.2f}% of pairs allowed"
        )
        if global_summary:
            title += "\n+ a pooled global summary added to every query"
    figure = Figure(figsize=(6, 6), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.imshow(image.numpy(), cmap="Greys", vmin=0.0, vmax=1.0, interpolation="nearest")
    axes.set_xlabel(f"key ({unit})")
    axes.set_ylabel(f"query ({unit})")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _allowed_fraction(seq_len: int, block_size: int, density: Tensor) -> float:
    """Fraction of all ``T * T`` pairs allowed, from the per-block-pair densities."""
    N = density.shape[0]
    sizes = torch.full((N,), float(block_size))
    sizes[-1] = seq_len - (N - 1) * block_size
    return float((density * sizes[:, None] * sizes[None, :]).sum() / (seq_len * seq_len))
