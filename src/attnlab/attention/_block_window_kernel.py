"""The fast kernel of block-sparse attention: batched GEMMs over block windows.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` sequence length, ``D`` head dim
(``Dv`` for values), ``L`` block size, ``N = ceil(T / L)`` blocks per sequence,
``n = B * H * N`` blocks of all sequences and heads, ``W = (2 * window + 1) * L`` window
keys of a block, ``G`` global keys, ``c`` blocks in one chunk.

Every block of every head is one ``[L, D]`` slice of a flat ``[n, L, D]`` buffer (a
contiguous ``[B, H, N * L, D]`` tensor is one already). Keys and values are laid out
the same way with ``window`` blocks of zeros before and after, so the ``W`` window keys
of block ``i`` are flat blocks ``i .. i + 2 * window`` of the padded buffer: an
overlapping strided *view* ``[n, W, D]`` that batched GEMMs read in place (keys are not
copied ``2 * window + 1`` times). Where a window reaches into the neighbouring head or
sequence, past the sequence end or onto masked keys, an additive bias removes those
keys; only such blocks pay for it.

Without global keys, the forward attends every block whose window view exists in one
``F.scaled_dot_product_attention`` call without a mask (torch's fused kernel beats
GEMM + softmax + GEMM, most of all in bfloat16) and then recomputes only the blocks with
a bias, exactly: ``baddbmm`` -> bias -> softmax -> ``bmm``. With global keys every block
takes that route, with the ``G`` global keys as a second, small score matrix in the
same softmax. The backward runs in chunks of ``c`` blocks whose ``[c, L, W]`` scores
are reused from chunk to chunk (fresh large buffers cost page faults); it recomputes a
chunk's probabilities rather than keeping all ``[n, L, W]`` of them, then
``dS = P * (dO V^T - rowsum(dO * O))`` and four GEMMs. Memory is ``O(T * D)`` plus one
chunk.
"""

from __future__ import annotations

import bisect
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["block_window_attention"]

_NEG_INF = float("-inf")
# One chunk's scores hold about this many elements (32 MiB in float32). Smaller chunks fit
# the caches better, but every torch call is a parallel region: on a busy machine each
# one waits for the slowest thread, so fewer, larger calls are the more robust choice.
_CHUNK_ELEMENTS = 8 * 1024 * 1024


def block_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    window_bias: Tensor,
    global_bias: Tensor,
    global_index: Tensor,
    *,
    block_size: int,
    window: int,
    scale: float,
) -> Tensor:
    """Each block's queries attend its window of key blocks and the global keys.

    Args:
        query: ``[B, H, T, D]``.
        key: ``[B, H, T, D]``.
        value: ``[B, H, T, Dv]``.
        window_bias: ``[B * N, W]`` additive bias of block ``(b, n)``'s window keys
            (key blocks ``n - window .. n + window``), shared by the heads: 0 for a key
            that may be attended, ``-inf`` for one that may not (or a float bias).
        global_bias: ``[B * N, G]`` the same for the global keys.
        global_index: ``[G]`` long: positions of the global keys.
        block_size: ``L``.
        window: neighbouring blocks on each side.
        scale: score scale.

    Returns:
        ``[B, H, T, Dv]``; zero for blocks that have no key. The biases get no gradient.
    """
    return _BlockWindowAttention.apply(
        query, key, value, window_bias, global_bias, global_index, block_size, window, scale
    )


def _padded_blocks(x: Tensor, blocks: int, block_size: int, margin: int) -> Tensor:
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


def _flat_blocks(x: Tensor, blocks: int, block_size: int) -> Tensor:
    """``[B, H, T, D]`` -> ``[n, L, D]``: a view when ``x`` already has that layout."""
    B, H, T, D = x.shape
    if x.is_contiguous() and T == blocks * block_size:
        return x.view(B * H * blocks, block_size, D)
    return _padded_blocks(x, blocks, block_size, 0)


class _Windows:
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
    def of(cls, x: Tensor, blocks: int, block_size: int, window: int) -> "_Windows":
        B, H, T, D = x.shape
        count = B * H * blocks
        if x.is_contiguous() and T == blocks * block_size:
            return cls(x.view(count, block_size, D), -window, count, window)  # read in place
        return cls(_padded_blocks(x, blocks, block_size, window), 0, count, window)  # [w + n + w, L, D]

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


def _add_to_windows(target: Tensor, window_grad: Tensor, start: int, spread: int) -> None:
    """Add the ``[c, W, D]`` gradients of windows ``start ..`` into padded ``[.., L, D]`` blocks.

    Offset ``o`` of window ``i`` is padded block ``i + o``: one slice addition per offset.
    """
    count, _, D = window_grad.shape
    per_offset = window_grad.view(count, spread, -1, D)  # [c, 2w + 1, L, D]
    for offset in range(spread):
        target[start + offset : start + offset + count] += per_offset[:, offset]


class _BlockBias:
    """Which blocks need their bias, which have no key at all, and the bias of each.

    Flat block ``i`` of ``[B, H, N]`` takes bias row ``(i // (H * N)) * N + i % N``: the
    heads share the key mask.
    """

    def __init__(self, window_bias: Tensor, global_bias: Tensor, heads: int, blocks: int) -> None:
        self.window_bias, self.global_bias = window_bias, global_bias
        sequences = window_bias.shape[0] // blocks  # B
        rows = torch.arange(window_bias.shape[0], device=window_bias.device)
        self.rows = rows.view(sequences, 1, blocks).expand(sequences, heads, blocks).reshape(-1)  # [n]
        needs_bias = (window_bias != 0).any(dim=1)[self.rows]  # [n]
        has_key = (window_bias != _NEG_INF).any(dim=1) | (global_bias != _NEG_INF).any(dim=1)  # [B * N]
        self.biased = needs_bias.nonzero().squeeze(1).tolist()  # sorted flat block indices
        self.empty = (~has_key[self.rows]).nonzero().squeeze(1).tolist()

    @staticmethod
    def between(blocks: list[int], start: int, stop: int) -> list[int]:
        return blocks[bisect.bisect_left(blocks, start) : bisect.bisect_left(blocks, stop)]


def _probabilities(
    scores: Tensor,
    queries: Tensor,
    key_windows: Tensor,
    scale: float,
    window_bias: Optional[Tensor],
    empty: list[int],
    global_keys: Optional[Tensor] = None,
    global_bias: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Softmax over each block's window keys and global keys, written into ``scores``.

    Args:
        scores: ``[c, L, W]`` buffer to fill.
        queries: ``[c, L, D]``.
        key_windows: ``[c, W, D]``.
        window_bias: ``[c, W]`` (``None``: nothing to remove).
        empty: blocks (of the ``c``) without any key: their probabilities are zero.
        global_keys: ``[c, G, D]`` or ``None``.
        global_bias: ``[c, G]``.

    Returns:
        probabilities ``[c, L, W]`` (``scores``) and ``[c, L, G]`` (or ``None``).
    """
    torch.baddbmm(scores, queries, key_windows.transpose(1, 2), beta=0, alpha=scale, out=scores)
    if window_bias is not None:
        scores += window_bias[:, None, :]
    if global_keys is None:
        torch.softmax(scores, dim=-1, out=scores)
        if empty:
            scores[empty] = 0  # their softmax over no key is NaN; they attend nothing
        return scores, None
    global_scores = torch.baddbmm(global_bias[:, None, :], queries, global_keys.transpose(1, 2), alpha=scale)
    # One softmax over the window and the global keys, in two pieces.
    top = torch.maximum(
        scores.amax(dim=-1, keepdim=True), global_scores.amax(dim=-1, keepdim=True)
    )  # [c, L, 1]
    top.nan_to_num_(neginf=0.0)  # rows with no key: exp(-inf - 0) = 0 below
    scores.sub_(top).exp_()
    global_scores.sub_(top).exp_()
    total = scores.sum(dim=-1, keepdim=True) + global_scores.sum(dim=-1, keepdim=True)  # [c, L, 1]
    total.masked_fill_(total == 0, 1.0)
    return scores.div_(total), global_scores.div_(total)


def _chunk_size(L: int, W: int, count: int) -> int:
    return max(1, min(count, _CHUNK_ELEMENTS // (L * W)))


class _BlockWindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, window_bias, global_bias, global_index, block_size, window, scale):
        B, H, T, D = query.shape
        Dv = value.shape[-1]
        L, w = block_size, window
        N = window_bias.shape[0] // B
        n, W, G = B * H * N, (2 * w + 1) * L, global_index.numel()

        query_flat = _flat_blocks(query, N, L)  # [n, L, D]
        keys = _Windows.of(key, N, L, w)
        values = _Windows.of(value, N, L, w)
        bias = _BlockBias(window_bias, global_bias, H, N)
        global_keys = global_values = None
        if G:
            # The blocks of head (b, h) share its G global keys: [n, G, D] by repetition.
            global_keys = key[:, :, global_index, None].expand(B, H, G, N, D).transpose(2, 3).reshape(n, G, D)
            global_values = (
                value[:, :, global_index, None].expand(B, H, G, N, Dv).transpose(2, 3).reshape(n, G, Dv)
            )

        chunk = _chunk_size(L, W, n)
        scores = query_flat.new_empty(chunk, L, W)  # reused by every chunk
        if G:
            output = query.new_empty(n, L, Dv)
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                rows = bias.rows[start:stop]
                empty = [block - start for block in bias.between(bias.empty, start, stop)]
                probs, global_probs = _probabilities(
                    scores[: stop - start],
                    query_flat[start:stop],
                    keys.windows(start, stop),
                    scale,
                    window_bias[rows],
                    empty,
                    global_keys[start:stop],
                    global_bias[rows],
                )  # [c, L, W], [c, L, G]
                torch.bmm(probs, values.windows(start, stop), out=output[start:stop])
                output[start:stop].baddbmm_(global_probs, global_values[start:stop])
        else:
            # Every block whose window lies inside the keys in one fused call, masked or not;
            # then the few blocks with a bias again, exactly.
            first, stop = keys.first, keys.stop
            output = None
            if first < stop:
                inside = F.scaled_dot_product_attention(
                    query_flat[first:stop, None],
                    keys.view(first, stop)[:, None],
                    values.view(first, stop)[:, None],
                    scale=scale,
                )[:, 0]  # [stop - first, L, Dv]
                output = inside if stop - first == n else None
            if output is None:
                output = query.new_empty(n, L, Dv)
                if first < stop:
                    output[first:stop] = inside
            biased, empty_blocks = bias.biased, set(bias.empty)
            assert set(range(max(first, 0))) | set(range(min(stop, n), n)) <= set(biased), (
                "edge windows are biased"
            )
            for offset in range(0, len(biased), chunk):
                blocks = torch.tensor(biased[offset : offset + chunk], device=query.device)  # [m]
                empty = [
                    index
                    for index, block in enumerate(biased[offset : offset + chunk])
                    if block in empty_blocks
                ]
                probs, _ = _probabilities(
                    scores[: blocks.numel()],
                    query_flat[blocks],
                    keys.gather(blocks),
                    scale,
                    window_bias[bias.rows[blocks]],
                    empty,
                )  # [m, L, W]
                output[blocks] = torch.bmm(probs, values.gather(blocks))

        ctx.save_for_backward(
            query_flat, keys.source, values.source, output, window_bias, global_bias, global_index
        )
        ctx.global_tensors = (global_keys, global_values)
        ctx.sizes = (B, H, T, N, L, w, scale, keys.shift, values.shift)
        return output.view(B, H, N * L, Dv)[:, :, :T]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        query_flat, key_source, value_source, output, window_bias, global_bias, global_index = (
            ctx.saved_tensors
        )
        global_keys, global_values = ctx.global_tensors
        B, H, T, N, L, w, scale, key_shift, value_shift = ctx.sizes
        n, D, Dv, G = query_flat.shape[0], query_flat.shape[-1], value_source.shape[-1], global_index.numel()
        W, spread = (2 * w + 1) * L, 2 * w + 1
        keys = _Windows(key_source, key_shift, n, w)
        values = _Windows(value_source, value_shift, n, w)
        bias = _BlockBias(window_bias, global_bias, H, N)

        grad_flat = _flat_blocks(grad_output, N, L)  # [n, L, Dv]
        # The softmax backward's row term: dS = P * (dP - rowsum(dO * O)).
        row_term = torch.linalg.vecdot(grad_flat, output).unsqueeze(-1)  # [n, L, 1]

        grad_query = query_flat.new_empty(n, L, D)
        grad_key_padded = query_flat.new_zeros(n + 2 * w, L, D)  # window offset o of block i is block i + o
        grad_value_padded = query_flat.new_zeros(n + 2 * w, L, Dv)
        if G:
            grad_global_keys = query_flat.new_empty(n, G, D)
            grad_global_values = query_flat.new_empty(n, G, Dv)
        chunk = _chunk_size(L, W, n)
        scores_buffer = query_flat.new_empty(chunk, L, W)  # the buffers are reused by every chunk
        scores_grad_buffer = query_flat.new_empty(chunk, L, W)
        window_grad = query_flat.new_empty(chunk, W, max(D, Dv))
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            count = stop - start
            rows = bias.rows[start:stop]
            biased = bias.between(bias.biased, start, stop)
            window_bias_rows = window_bias[rows] if biased else None
            empty = [block - start for block in bias.between(bias.empty, start, stop)]
            queries = query_flat[start:stop]  # [c, L, D]
            key_windows = keys.windows(start, stop)  # [c, W, D]
            value_windows = values.windows(start, stop)  # [c, W, Dv]
            probs, global_probs = _probabilities(
                scores_buffer[:count],
                queries,
                key_windows,
                scale,
                window_bias_rows,
                empty,
                global_keys[start:stop] if G else None,
                global_bias[rows] if G else None,
            )  # [c, L, W], [c, L, G] | None
            grad_out = grad_flat[start:stop]  # [c, L, Dv]

            value_grad = window_grad[:count, :, :Dv]
            torch.bmm(probs.transpose(1, 2), grad_out, out=value_grad)  # [c, W, Dv] = P^T dO
            _add_to_windows(grad_value_padded, value_grad, start, spread)

            scores_grad = scores_grad_buffer[:count]
            torch.bmm(grad_out, value_windows.transpose(1, 2), out=scores_grad)  # [c, L, W] = dO V^T
            scores_grad.sub_(row_term[start:stop]).mul_(probs)  # dS
            torch.baddbmm(
                grad_query[start:stop],
                scores_grad,
                key_windows,
                beta=0,
                alpha=scale,
                out=grad_query[start:stop],
            )  # [c, L, D] = scale * dS K
            key_grad = window_grad[:count, :, :D]
            torch.baddbmm(key_grad, scores_grad.transpose(1, 2), queries, beta=0, alpha=scale, out=key_grad)
            _add_to_windows(grad_key_padded, key_grad, start, spread)  # [c, W, D] = scale * dS^T Q

            if G:
                torch.bmm(
                    global_probs.transpose(1, 2), grad_out, out=grad_global_values[start:stop]
                )  # [c, G, Dv]
                global_scores_grad = torch.bmm(
                    grad_out, global_values[start:stop].transpose(1, 2)
                )  # [c, L, G]
                global_scores_grad.sub_(row_term[start:stop]).mul_(global_probs)
                grad_query[start:stop].baddbmm_(global_scores_grad, global_keys[start:stop], alpha=scale)
                torch.baddbmm(
                    grad_global_keys[start:stop],
                    global_scores_grad.transpose(1, 2),
                    queries,
                    beta=0,
                    alpha=scale,
                    out=grad_global_keys[start:stop],
                )  # [c, G, D]

        def sequence_layout(flat: Tensor, margin: int) -> Tensor:
            return flat[margin : margin + n].view(B, H, N * L, -1)[:, :, :T]  # [B, H, T, D]

        grad_key = sequence_layout(grad_key_padded, w)
        grad_value = sequence_layout(grad_value_padded, w)
        if G:
            # Each head's G global keys served all its N blocks: sum their gradients.
            grad_key = grad_key.index_add(2, global_index, grad_global_keys.view(B, H, N, G, D).sum(2))
            grad_value = grad_value.index_add(2, global_index, grad_global_values.view(B, H, N, G, Dv).sum(2))
        return sequence_layout(grad_query, 0), grad_key, grad_value, None, None, None, None, None, None
