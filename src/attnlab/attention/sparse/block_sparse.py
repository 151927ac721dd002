"""Block-local attention with global tokens: the kernel behind ``SparseAttention``.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` sequence length (queries and keys
are positions of one sequence), ``D`` head dim (``Dv`` for values), ``L`` block size,
``N`` number of blocks (``ceil(T / L)``), ``W`` keys in a block's window
(``(2 * window + 1) * L``), ``G`` global tokens, ``K = W + G`` candidate keys per block.

Which keys a query may attend (``True`` = may attend, as everywhere in attnlab):
query ``i`` may attend key ``j`` when ``key_mask[b, j]`` allows it and

* ``|i // L - j // L| <= window`` (same block, or one of ``window`` blocks each side), or
* ``i`` is a global token (it attends every key), or
* ``j`` is a global token (every query attends it).

How it is computed, in ``O(T * K)`` time and memory, forward and backward: queries
are cut into blocks of ``L`` (the sequence is padded to ``N * L``) and every block
attends the ``W`` keys of its window, read as a strided *view* of the keys (nothing of
size ``T x T`` is built, and keys are not copied ``2 * window + 1`` times). A
``[B * N, K]`` additive bias removes padding, keys of the neighbouring sequence in the
batch, and duplicates of global keys already in the window; global tokens' own rows are
computed densely (``G`` rows over all ``T`` keys) and replace their block rows.

Two paths compute the blocks. The default one (:mod:`._block_window_kernel`) runs batched
GEMMs over chunks of blocks with its own backward, and pays for the bias only in the
blocks that have one. With ``need_weights`` or ``dropout_p > 0`` every block goes through
one :func:`~attnlab.attention.functional.attention` call instead, which returns the
probabilities and applies dropout; the tests hold each path to the other and to a dense
float64 reference.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._dispatch import window_kernel
from ..._threads import threads_for_load
from ._block_window_kernel import block_window_attention
from ..functional import attention

__all__ = ["BlockSparseResult", "BlockSparseWeights", "block_sparse_attention", "block_sparse_mask"]

_NEG_INF = float("-inf")


class BlockSparseWeights(NamedTuple):
    """Attention probabilities of block-sparse attention in block layout.

    The memory of this form grows like ``T * K``; :meth:`to_dense` draws the usual
    ``[B, H, T, T]`` matrix for short inputs.

    Attributes:
        local: ``[B, H, N, L, K]``: the probabilities of query ``n * L + l`` over the
            ``K`` candidate keys of block ``n`` (its window, then the global tokens).
            Rows of global tokens and rows past the sequence end are zero here; global
            tokens' rows are in ``global_rows``.
        key_positions: ``[N, K]`` long: the sequence position of each candidate key,
            ``-1`` where the window reaches past either end of the sequence.
        global_positions: ``[G]`` long: positions of the global tokens.
        global_rows: ``[B, H, G, T]``: probabilities of the global tokens' queries.
        row_has_key: ``[B, T]`` bool: which query rows had at least one key to attend
            (the others have zero weights and zero output).
        summary: ``[B, H, 1, T]`` weights of the pooled global-summary query, whose
            context is added to every row with a key (see ``SparseAttention``); ``None``
            when there is no summary.
    """

    local: Tensor
    key_positions: Tensor
    global_positions: Tensor
    global_rows: Tensor
    row_has_key: Tensor
    summary: Optional[Tensor] = None

    @property
    def seq_len(self) -> int:
        return self.row_has_key.shape[1]

    def to_dense(self) -> Tensor:
        """The ``[B, H, T, T]`` matrix ``M`` with ``output = M @ values`` (per head).

        ``M[b, h, i, j]`` is how much of value ``j`` query ``i`` receives: the sparse
        attention probability plus, when there is a global summary, the summary weight
        of key ``j`` (so rows sum to 2 with a summary, 1 without; 0 for rows with no
        key). It needs ``B * H * T * T`` numbers: use it for short inputs.
        """
        B, H, N, L, K = self.local.shape
        T = self.seq_len
        columns = self.key_positions.masked_fill(self.key_positions < 0, T)  # [N, K], T = discard
        columns = columns[None, None, :, None, :].expand(B, H, N, L, K).reshape(B, H, N * L, K)
        dense = self.local.new_zeros(B, H, N * L, T + 1)
        dense.scatter_add_(-1, columns, self.local.reshape(B, H, N * L, K))
        dense = dense[:, :, :T, :T]  # [B, H, T, T]
        if self.global_positions.numel():
            dense[:, :, self.global_positions] = self.global_rows
        if self.summary is not None:
            dense = dense + self.summary * self.row_has_key[:, None, :, None].to(dense.dtype)
        return dense


class BlockSparseResult(NamedTuple):
    """``(output [B, H, T, Dv], weights | None, row_has_key [B, T])``."""

    output: Tensor
    weights: Optional[BlockSparseWeights]
    row_has_key: Tensor


def block_sparse_mask(
    seq_len: int,
    block_size: int,
    window: int = 0,
    global_positions: Sequence[int] = (),
    *,
    device: Optional[torch.device] = None,
) -> Tensor:
    """The dense ``[T, T]`` boolean pattern (``True`` = may attend) of the kernel.

    For short inputs, pictures and comparisons with dense attention; it costs
    ``T * T`` bytes.
    """
    blocks = torch.arange(seq_len, device=device) // block_size
    allowed = (blocks[:, None] - blocks[None, :]).abs() <= window  # [T, T]
    positions = torch.tensor(sorted(set(global_positions)), dtype=torch.long, device=device)
    positions = positions[positions < seq_len]
    allowed[positions, :] = True
    allowed[:, positions] = True
    return allowed


def _key_bias(key_mask: Optional[Tensor], batch: int, length: int, padded: int, dtype, device) -> Tensor:
    """``[B, padded]`` additive bias: 0 (or the float mask) on keys, -inf elsewhere."""
    bias = torch.zeros(batch, padded, dtype=dtype, device=device)
    if key_mask is not None:
        if key_mask.dtype == torch.bool:
            bias[:, :length].masked_fill_(~key_mask, _NEG_INF)
        else:
            bias[:, :length] = key_mask
    bias[:, length:] = _NEG_INF
    return bias


class _BlockWindows(torch.autograd.Function):
    """``[B, H, T, D]`` -> ``[B * N, H, W, D]``: each query block's window of keys.

    Sequences of the batch are laid end to end (each zero-padded to ``N * L``) with
    ``window`` blocks of zeros at both ends; the windows are a strided *view* of that
    buffer, so keys are not copied ``2 * window + 1`` times. Keys that belong to a
    neighbouring sequence are removed by the mask. The backward sums the ``2w + 1``
    shifted block slices of the incoming gradient (cheaper than ``unfold``'s generic
    backward and without a ``[B * N, H, W, D]`` intermediate of its own).
    """

    @staticmethod
    def forward(ctx, x: Tensor, blocks: int, block_size: int, window: int) -> Tensor:
        B, H, T, D = x.shape
        L = block_size
        ctx.sizes = (B, H, T, D, blocks, L, window)
        flat = x.new_empty(2 * window + B * blocks, L, H, D)  # [margin blocks + B * N blocks, L, H, D]
        flat[:window].zero_()
        flat[window + B * blocks :].zero_()
        body = flat[window : window + B * blocks].view(B, blocks * L, H, D)  # [B, N * L, H, D]
        body[:, T:].zero_()  # padding must be finite: masked scores still multiply these values
        body[:, :T] = x.transpose(1, 2)
        windows = flat.view(-1, H, D).unfold(0, (2 * window + 1) * L, L)  # [B * N, H, D, W]
        return windows.transpose(-1, -2)  # [B * N, H, W, D]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_windows: Tensor):
        B, H, T, D, blocks, L, window = ctx.sizes
        count = B * blocks
        per_offset = grad_windows.unflatten(2, (2 * window + 1, L))  # [B * N, H, 2w + 1, L, D]
        # Key block f of the padded buffer is offset o of query block f - o.
        grad_flat = grad_windows.new_empty(count + 2 * window, L, H, D).permute(0, 2, 1, 3)  # [.., H, L, D]
        grad_flat[:count] = per_offset[:, :, 0]
        grad_flat[count:].zero_()
        for offset in range(1, 2 * window + 1):
            grad_flat[offset : offset + count] += per_offset[:, :, offset]
        body = grad_flat[window : window + count].permute(0, 2, 1, 3)  # [B * N, L, H, D]
        grad_x = body.reshape(B, blocks * L, H, D)[:, :T].transpose(1, 2)  # [B, H, T, D]
        return grad_x, None, None, None


def _block_bias(
    key_bias: Tensor, blocks: int, block_size: int, window: int, global_positions: Tensor
) -> tuple[Tensor, Tensor]:
    """Additive mask ``[B * N, K]`` of every block's candidate keys and their positions ``[N, K]``."""
    B = key_bias.shape[0]
    L, margin = block_size, window * block_size
    device = key_bias.device
    padded = F.pad(key_bias.reshape(-1), (margin, margin), value=_NEG_INF)
    bias = padded.unfold(0, (2 * window + 1) * L, L)  # [B * N, W]
    block = torch.arange(blocks, device=device)  # [N]
    offset = torch.arange(-window, window + 1, device=device)  # [2w + 1]
    key_block = block[:, None] + offset  # [N, 2w + 1]
    inside = ((key_block >= 0) & (key_block < blocks)).repeat_interleave(L, dim=1)  # [N, W]
    positions = (key_block[:, :, None] * L + torch.arange(L, device=device)).reshape(blocks, -1)
    positions = positions.masked_fill(~inside, -1)  # [N, W]
    bias = bias.masked_fill(~inside.repeat(B, 1), _NEG_INF)  # keys of the neighbouring sequence
    if global_positions.numel():
        G = global_positions.numel()
        global_bias = key_bias[:, global_positions]  # [B, G]
        # A global key already inside the window is attended there; drop the copy.
        in_window = (global_positions[None, :] // L - block[:, None]).abs() <= window  # [N, G]
        global_bias = global_bias[:, None, :].masked_fill(in_window, _NEG_INF)  # [B, N, G]
        bias = torch.cat((bias, global_bias.reshape(B * blocks, G)), dim=1)  # [B * N, K]
        positions = torch.cat((positions, global_positions.expand(blocks, G)), dim=1)  # [N, K]
    return bias, positions


def _attend_block_windows(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    bias: Tensor,
    blocks: int,
    block_size: int,
    window: int,
    global_index: Tensor,
    dropout_p: float,
    scale: float,
    need_weights: bool,
) -> tuple[Tensor, Optional[Tensor]]:
    """Every block's attention in one :func:`attention` call (probabilities, dropout).

    Returns the output ``[B, H, T, Dv]`` and, with ``need_weights``, the probabilities
    ``[B * N, H, L, K]``.
    """
    B, H, T, D = query.shape
    N, L = blocks, block_size
    query_blocks = query.transpose(1, 2)  # [B, T, H, D]
    if N * L != T:
        query_blocks = F.pad(query_blocks, (0, 0, 0, 0, 0, N * L - T))  # [B, N * L, H, D]
    query_blocks = query_blocks.reshape(B * N, L, H, D).transpose(1, 2)  # [B * N, H, L, D]
    key_blocks = _BlockWindows.apply(key, N, L, window)  # [B * N, H, W, D]
    value_blocks = _BlockWindows.apply(value, N, L, window)  # [B * N, H, W, Dv]
    if global_index.numel():
        G = global_index.numel()
        global_keys = key[:, :, global_index].unsqueeze(1).expand(B, N, H, G, D)  # [B, N, H, G, D]
        global_values = value[:, :, global_index].unsqueeze(1).expand(B, N, H, G, value.shape[-1])
        key_blocks = torch.cat((key_blocks, global_keys.reshape(B * N, H, G, D)), dim=2)  # [B*N, H, K, D]
        value_blocks = torch.cat((value_blocks, global_values.reshape(B * N, H, G, -1)), dim=2)
    block_out, block_weights = attention(
        query_blocks,
        key_blocks,
        value_blocks,
        attn_bias=bias[:, None, None, :],  # [B * N, 1, 1, K]
        dropout_p=dropout_p,
        scale=scale,
        need_weights=need_weights,
    )  # [B * N, H, L, Dv], [B * N, H, L, K] | None
    Dv = value.shape[-1]
    output = block_out.transpose(1, 2).reshape(B, N * L, H, Dv)[:, :T].transpose(1, 2)  # [B, H, T, Dv]
    return output, block_weights


def block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor] = None,
    *,
    block_size: int,
    window: int = 0,
    global_positions: Sequence[int] = (),
    dropout_p: float = 0.0,
    scale: Optional[float] = None,
    need_weights: bool = False,
) -> BlockSparseResult:
    """Attention restricted to blocks, a sliding window of blocks and global tokens.

    See the module docstring for the exact pattern. Rows with no key to attend give
    zero output (and zero weights, zero gradients), never NaN. Nothing falls back to
    dense attention: memory and time are ``O(T * K)``.

    Args:
        query: ``[B, H, T, D]``.
        key: ``[B, H, T, D]`` (the same positions as the queries).
        value: ``[B, H, T, Dv]``.
        key_mask: ``[B, T]`` boolean (``True`` = this key may be attended) or additive
            float mask of the scores' dtype.
        block_size: ``L``.
        window: neighbouring blocks attended on each side (0 = own block only).
        global_positions: positions of global tokens; positions ``>= T`` are ignored.
        dropout_p: dropout on the attention probabilities.
        scale: score scale; defaults to ``1 / sqrt(D)``.
        need_weights: also return the probabilities in block layout.

    Returns:
        :class:`BlockSparseResult` ``(output [B, H, T, Dv], weights, row_has_key [B, T])``.
    """
    B, H, T, D = query.shape
    if key.shape[:3] != (B, H, T) or value.shape[:3] != (B, H, T):
        raise ValueError(
            "block-sparse attention is self-attention over one sequence: query, key and value "
            f"must share [B, H, T]; got {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if key_mask is not None and key_mask.shape != (B, T):
        raise ValueError(f"key_mask must be [B, T] = [{B}, {T}], got {tuple(key_mask.shape)}")
    L = block_size
    N = max(1, math.ceil(T / L))
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    device = query.device
    global_index = torch.tensor(
        sorted({p for p in global_positions if p < T}), dtype=torch.long, device=device
    )  # [G]

    # torch's path is a few dozen small operators (biases, windows, global rows), each a
    # parallel region that, on a busy machine, waits at its end for a thread the OS has
    # descheduled: it runs on the cores other processes leave free (attnlab._threads). A
    # kernel of attnlab's (AMX or portable) is one long parallel call that keeps every thread
    # busy to its end: it keeps torch's threads (with two other busy processes on 2 cores, the
    # portable kernel fwd+bwd went from 27x dense flash attention on the free core to 35x on both).
    kernel = not (need_weights or dropout_p > 0) and window_kernel(
        query, value.shape[-1], L, global_index.numel() > 0, scale)[0] != "torch"
    with contextlib.nullcontext() if kernel else threads_for_load():
        return _block_sparse_attention(query, key, value, key_mask, global_index, L, N, window, dropout_p,
                                       scale, need_weights)


def _block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Optional[Tensor],
    global_index: Tensor,
    L: int,
    N: int,
    window: int,
    dropout_p: float,
    scale: float,
    need_weights: bool,
) -> BlockSparseResult:
    B, H, T, D = query.shape
    device = query.device
    key_bias = _key_bias(key_mask, B, T, N * L, query.dtype, device)  # [B, N * L]
    bias, key_positions = _block_bias(key_bias, N, L, window, global_index)  # [B * N, K], [N, K]
    key_positions = key_positions.masked_fill(key_positions >= T, -1)

    global_weights = query.new_zeros(B, H, 0, T)
    if need_weights or dropout_p > 0:
        # The reference path: it returns the probabilities and applies dropout to them.
        output, block_weights = _attend_block_windows(
            query, key, value, bias, N, L, window, global_index, dropout_p, scale, need_weights
        )  # [B, H, T, Dv], [B * N, H, L, K] | None
        if global_index.numel():
            global_out, global_weights = attention(
                query[:, :, global_index],
                key,
                value,
                attn_bias=key_bias[:, None, None, :T],  # [B, 1, 1, T]
                dropout_p=dropout_p,
                scale=scale,
                need_weights=need_weights,
            )  # [B, H, G, Dv], [B, H, G, T] | None
            output = output.index_copy(2, global_index, global_out)
    else:
        W = (2 * window + 1) * L
        output = block_window_attention(
            query, key, value, bias[:, :W], bias[:, W:], global_index, key_bias,
            block_size=L, window=window, scale=scale,
        )  # [B, H, T, Dv], the global tokens' rows included
        block_weights = None
    row_has_key = (bias > _NEG_INF).any(dim=1)  # [B * N]
    row_has_key = row_has_key.view(B, N, 1).expand(B, N, L).reshape(B, N * L)[:, :T]  # [B, T]
    if global_index.numel():
        row_has_key = row_has_key.clone()
        row_has_key[:, global_index] = (key_bias[:, :T] > _NEG_INF).any(dim=1, keepdim=True)

    weights = None
    if need_weights:
        local = block_weights.view(B, N, H, L, -1).transpose(1, 2)  # [B, H, N, L, K]
        row_in_sequence = torch.ones(N * L, dtype=torch.bool, device=device)
        row_in_sequence[T:] = False
        row_in_sequence[global_index] = False
        local = local * row_in_sequence.view(1, 1, N, L, 1).to(local.dtype)
        weights = BlockSparseWeights(local, key_positions, global_index, global_weights, row_has_key)
    return BlockSparseResult(output, weights, row_has_key)
