"""Exact weights of chosen query rows, over every key, without the ``[T, S]`` map.

Dimension letters: ``B`` batch, ``H`` query heads, ``T`` query length, ``S`` key length,
``R`` chosen rows.

At long context the map of one layer is ``T x T`` per head: 32k tokens and 32 heads make
128 GiB in bfloat16. A user who studies what the last tokens attend to asks for those rows
(``rows=`` of an inspection block): the module's output still comes from its fused kernel,
and only the chosen queries go through :func:`~attnlab.attention.exact.exact_attention`,
``[B, H, R, S]``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ...attention.exact import exact_attention, query_rows_of

__all__ = ["RowChoice", "check_rows", "resolve_rows", "row_attention"]

# Query rows whose weights are kept: the last k (an int), a span (a slice or range), or
# positions (a sequence of ints; negative ones count from the end). ``None``: every row.
RowChoice = Union[None, int, slice, range, Sequence[int]]  # a range is its positions


def check_rows(rows: RowChoice) -> RowChoice:
    """``rows`` as given, once its kind is checked (its positions are checked against each
    call's length by :func:`resolve_rows`)."""
    if isinstance(rows, range):
        rows = list(rows)  # positions, its step included
    if rows is None or isinstance(rows, slice):
        if isinstance(rows, slice) and rows.step not in (None, 1):
            raise ValueError(f"rows={rows!r}: a span of query rows takes no step; list the positions instead")
        return rows
    if isinstance(rows, bool):
        raise TypeError(f"rows={rows!r}: give the number of last rows, a slice, or a list of positions")
    if isinstance(rows, int):
        if rows < 1:
            raise ValueError(f"rows={rows}: the number of last query rows to keep must be at least 1")
        return rows
    if isinstance(rows, Tensor):
        rows = rows.tolist()
    if not isinstance(rows, Sequence) or not rows or not all(
            isinstance(row, int) and not isinstance(row, bool) for row in rows):
        raise TypeError(f"rows={rows!r}: give the number of last rows (an int), a slice, or a non-empty list "
                        f"of positions")
    return list(rows)


def resolve_rows(rows: RowChoice, T: int) -> Optional[list[int]]:
    """The positions ``0 <= t < T`` that ``rows`` (:func:`check_rows`) chooses in a call with
    ``T`` query rows, in order; ``None`` for every row. The last ``k`` of a shorter call are
    all its rows (a decoding step has one)."""
    if rows is None:
        return None
    if isinstance(rows, int):
        return list(range(max(0, T - rows), T))
    if isinstance(rows, slice):
        chosen = list(range(*slice(rows.start, rows.stop).indices(T)))
        if not chosen:
            raise ValueError(f"rows={rows!r} holds no query row of this call, which has {T} (0 .. {T - 1})")
        return chosen
    outside = [row for row in rows if not -T <= row < T]
    if outside:
        raise ValueError(f"rows: position {outside[0]} is outside this call's {T} query rows "
                         f"(0 .. {T - 1}, or negative from the end)")
    return [row % T for row in rows]


def row_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                  rows: list[int], *, block_cells: int, scaling: Optional[float], dropout: float, causal: bool,
                  softcap: Optional[float], position_bias: Optional[Tensor], sinks: Optional[Tensor],
                  fused: Optional[Callable[[], Tensor]]) -> tuple[Tensor, Tensor]:
    """Every row's output (the fused kernel where the call has one, else exact blocks of rows
    without their weights) and the exact weights ``[B, H, R, S]`` of the ``R`` chosen rows
    over every key: the chosen queries alone go through :func:`exact_attention`, with their
    rows of the mask, bias and sinks (and of the causal constraint, which counts from the
    first row, as there). Blocks of chosen rows hold at most ``block_cells`` weights
    before they are kept."""
    block_rows = max(1, block_cells // max(1, query.shape[0] * query.shape[1] * key.shape[2]))
    options = dict(scaling=scaling, dropout=dropout, softcap=softcap, rows_per_block=block_rows)
    if fused is not None and softcap is None and sinks is None:
        output = fused()
    else:
        output, _ = exact_attention(module, query, key, value, attention_mask, causal=causal,
                                    position_bias=position_bias, sinks=sinks, **options)
    index = torch.tensor(rows, device=query.device)
    mask = query_rows_of(attention_mask, index)
    if causal:
        allowed = torch.arange(key.shape[2], device=query.device)[None, :] <= index[:, None]  # [R, S]
        if mask is None or mask.dtype == torch.bool:
            mask = allowed if mask is None else mask & allowed
        else:
            mask = mask.float().masked_fill(~allowed, float("-inf"))
    chosen_sinks = sinks if sinks is None or sinks.dim() == 1 else query_rows_of(sinks, index)
    _, weights = exact_attention(module, query.index_select(2, index), key, value, mask, causal=False,
                                 position_bias=query_rows_of(position_bias, index), sinks=chosen_sinks,
                                 keep_weights=True, **options)
    return output, weights
