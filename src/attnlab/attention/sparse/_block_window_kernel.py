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

Which kernel serves is chosen per call (``_kernel_choice``; ``ATTNLAB_SPARSE_KERNEL``), and
the backward takes its forward's. In bfloat16 and float32 on CPUs with AMX the forward and
the backward are attnlab's AMX kernel (``_block_window_native.cpp``: windows, global keys
and the global tokens' rows in one pass each; see ``_block_window_native.py``). In float32
elsewhere the windows and the global keys are attnlab's portable kernel
(``attnlab/_native/block_window.cpp``, see ``_block_window_portable.py``), and the global
tokens' own rows the torch ops below. Otherwise
the forward attends each run of consecutive blocks in one call of torch's fused CPU
kernel (``_scaled_dot_product_flash_attention_for_cpu``, which also returns the
log-sum-exp): without a mask where the window needs no bias, else with the window bias
as the mask (all windows are read in place; only the batch-edge windows are copied).
The ``G`` global keys are then merged in exactly: with ``lse = logaddexp(lse_window,
lse_global)``, the output is ``exp(lse_window - lse) * out_window + exp(S_global - lse)
@ V_global``, one small ``[T, G]`` score matrix per head (``-inf`` where a global key is
already in the window or is masked). The global tokens' own rows attend every key and
replace their block rows. Where that kernel is missing (other devices) every block
takes GEMM -> bias -> softmax -> GEMM in chunks instead.

The backward recomputes the probabilities as ``P = exp(S - lse)`` from the forward's
log-sum-exp (no softmax pass; global keys and masks included, as in the forward), then
``dS = P * (dO V^T - rowsum(dO * O))`` and four GEMMs. Where the kernel does not serve it
runs in torch ops: the windows in chunks of ``c`` blocks whose ``[c, L, W]`` buffers are
reused from chunk to chunk (fresh large buffers cost page faults), the global keys' and
global rows' parts as small GEMMs over whole heads. Memory is ``O(T * D)`` plus one chunk.
"""

from __future__ import annotations

import bisect
import contextlib
from typing import Optional

import torch
from torch import Tensor

from ..._threads import threads_for_load
from ._kernel_choice import window_kernel

__all__ = ["block_window_attention"]

_NEG_INF = float("-inf")
# One chunk's scores hold about this many elements (8 MiB in float32). Smaller chunks fit
# the caches better (the backward's elementwise passes over a chunk are memory-bound;
# 32 MiB chunks were ~10 % slower fwd+bwd), but every torch call is a parallel region: on
# a busy machine each waits for the slowest thread, so chunks should not be tiny.
_CHUNK_ELEMENTS = 2 * 1024 * 1024


def block_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    window_bias: Tensor,
    global_bias: Tensor,
    global_index: Tensor,
    key_bias: Tensor,
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
        global_index: ``[G]`` long: positions of the global tokens. Their queries attend
            every key: their rows are computed densely and replace their block rows.
        key_bias: ``[B, N * L]`` additive bias of every key for the global queries.
        block_size: ``L``.
        window: neighbouring blocks on each side.
        scale: score scale.

    Returns:
        ``[B, H, T, Dv]``; zero for blocks that have no key. The biases get no gradient.
    """
    return _BlockWindowAttention.apply(
        query, key, value, window_bias, global_bias, global_index, key_bias, block_size, window, scale
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


def _add_to_windows(target: Tensor, window_grad: Tensor, start: int, spread: int) -> None:
    """Add the ``[c, W, D]`` gradients of windows ``start ..`` into padded ``[.., L, D]`` blocks.

    Offset ``o`` of window ``i`` is padded block ``i + o``: one slice addition per offset.
    Windows must come in order from block 0: offset ``2w`` is the first to reach its padded
    blocks and is copied (the first ``2w`` padded blocks must start at zero).
    """
    count, _, D = window_grad.shape
    per_offset = window_grad.view(count, spread, -1, D)  # [c, 2w + 1, L, D]
    last = spread - 1
    target[start + last : start + last + count] = per_offset[:, last]  # their first contribution
    for offset in range(last):  # add_, not +=: a subscripted += copies the slice onto itself
        target[start + offset : start + offset + count].add_(per_offset[:, offset])


class _BlockBias:
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


def _flash_with_logsumexp(query: Tensor):
    """torch's fused CPU attention that also returns the log-sum-exp, or ``None``.

    ``op(q, k, v, dropout_p, is_causal, attn_mask=, scale=)`` -> ``(output [.., T, Dv],
    logsumexp [.., T])``, natural log, float32 for reduced-precision inputs; a row
    whose keys are all masked gives output 0 and log-sum-exp 0 (not ``-inf``).
    """
    if query.device.type != "cpu":
        return None
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _probabilities(
    scores: Tensor,
    queries: Tensor,
    key_windows: Tensor,
    scale: float,
    window_bias: Optional[Tensor],
    global_keys: Optional[Tensor] = None,
    global_bias: Optional[Tensor] = None,
) -> tuple[Tensor, Optional[Tensor], Tensor]:
    """Softmax over each block's window keys and global keys, written into ``scores``.

    Args:
        scores: ``[c, L, W]`` buffer to fill.
        queries: ``[c, L, D]``.
        key_windows: ``[c, W, D]``.
        window_bias: ``[c, W]`` (``None``: nothing to remove).
        global_keys: ``[c, G, D]`` or ``None``.
        global_bias: ``[c, G]``.

    Returns:
        probabilities ``[c, L, W]`` (``scores``), ``[c, L, G]`` (or ``None``) and the
        log-sum-exp ``[c, L]`` (in float32 at least; ``-inf``, and zero probabilities, in
        rows without any key).
    """
    torch.baddbmm(scores, queries, key_windows.transpose(1, 2), beta=0, alpha=scale, out=scores)
    if window_bias is not None:
        scores += window_bias[:, None, :]
    top = scores.amax(dim=-1, keepdim=True)  # [c, L, 1]
    global_scores = None
    if global_keys is not None:
        global_scores = torch.baddbmm(
            global_bias[:, None, :], queries, global_keys.transpose(1, 2), alpha=scale
        )  # [c, L, G]
        top = torch.maximum(top, global_scores.amax(dim=-1, keepdim=True))
    top.nan_to_num_(neginf=0.0)  # rows with no key: exp(-inf - 0) = 0 below
    total = scores.sub_(top).exp_().sum(dim=-1, keepdim=True)  # [c, L, 1]
    if global_scores is not None:
        total += global_scores.sub_(top).exp_().sum(dim=-1, keepdim=True)
    precision = torch.promote_types(scores.dtype, torch.float32)
    logsumexp = (top.to(precision) + total.to(precision).log()).squeeze(-1)  # [c, L]; log 0 = -inf
    total.masked_fill_(total == 0, 1.0)
    scores.div_(total)
    if global_scores is not None:
        global_scores.div_(total)
    return scores, global_scores, logsumexp


def _chunk_size(L: int, W: int, count: int) -> int:
    return max(1, min(count, _CHUNK_ELEMENTS // (L * W)))


def _chunks(count: int, chunk: int, first: int, stop: int) -> list[tuple[int, int]]:
    """``[start, stop)`` chunks of ``count`` blocks, in order; the blocks without a window
    view (``< first`` or ``>= stop``) in chunks of their own, so that only they are copied."""
    first, stop = min(max(first, 0), count), min(max(stop, 0), count)
    stop = max(stop, first)
    bounds = [(0, first)] if first else []
    bounds += [(start, min(stop, start + chunk)) for start in range(first, stop, chunk)]
    bounds += [(start, min(count, start + chunk)) for start in range(stop, count, chunk)]
    return bounds


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` runs of consecutive blocks in sorted ``blocks``."""
    runs: list[tuple[int, int]] = []
    for block in blocks:
        if runs and runs[-1][1] == block:
            runs[-1] = (runs[-1][0], block + 1)
        else:
            runs.append((block, block + 1))
    return runs


def _fused_window_attention(
    flash, query_flat: Tensor, keys: _Windows, values: _Windows, bias: _BlockBias, scale: float
) -> tuple[Tensor, Tensor]:
    """Every block over its window keys alone with torch's fused kernel: ``[n, L, Dv]``, ``[n, L]``.

    One call per run of consecutive blocks: without a mask where their windows need no
    bias (the fastest kernel), else with the window bias as the mask. Windows are read
    in place; only the blocks at the batch edges, which have no view, are copied.
    """
    n, L, _ = query_flat.shape
    first, stop = max(keys.first, values.first, 0), min(keys.stop, values.stop, n)  # both read in place
    assert set(range(first)) | set(range(stop, n)) <= set(bias.biased), "edge windows are biased"
    biased = bias.between(bias.biased, first, stop)
    unbiased, run_start = [], first
    for block in biased + [stop]:
        if block > run_start:
            unbiased.append((run_start, block))
        run_start = block + 1

    def window_bias(blocks) -> Tensor:
        return bias.window_bias[bias.rows[blocks]][:, None, None, :]  # [m, 1, 1, W]

    results = []  # (blocks, output [m, 1, L, Dv], logsumexp [m, 1, L])
    for start, end in unbiased:
        results.append((slice(start, end), *flash(
            query_flat[start:end, None], keys.view(start, end)[:, None], values.view(start, end)[:, None],
            0.0, False, scale=scale,
        )))
    for start, end in _runs(biased):
        results.append((slice(start, end), *flash(
            query_flat[start:end, None], keys.view(start, end)[:, None], values.view(start, end)[:, None],
            0.0, False, attn_mask=window_bias(slice(start, end)), scale=scale,
        )))
    edges = [block for block in bias.biased if not first <= block < stop]
    if edges:
        blocks = torch.tensor(edges, device=query_flat.device)  # [m]
        results.append((blocks, *flash(
            query_flat[blocks, None], keys.gather(blocks)[:, None], values.gather(blocks)[:, None],
            0.0, False, attn_mask=window_bias(blocks), scale=scale,
        )))

    if len(results) == 1 and results[0][0] == slice(0, n):
        output, logsumexp = results[0][1][:, 0], results[0][2][:, 0]
    else:
        output = query_flat.new_empty(n, L, values.D)
        logsumexp = query_flat.new_empty(n, L, dtype=torch.promote_types(query_flat.dtype, torch.float32))
        for blocks, block_output, block_logsumexp in results:
            output[blocks] = block_output[:, 0]
            logsumexp[blocks] = block_logsumexp[:, 0]
    if bias.no_window_key.numel():
        output[bias.no_window_key] = 0
        logsumexp[bias.no_window_key] = _NEG_INF  # the kernel reports 0 for such rows
    return output, logsumexp


def _merge_global_keys(
    output: Tensor,
    logsumexp: Tensor,
    query_flat: Tensor,
    global_keys: Tensor,
    global_values: Tensor,
    global_bias: Tensor,
    scale: float,
) -> Tensor:
    """Add the global keys to a softmax over the window keys alone, exactly, in place.

    With ``lse = logaddexp(lse_window, lse_global)`` the joint softmax's output is
    ``exp(lse_window - lse) * out_window + exp(S_global - lse) @ V_global``.

    Args:
        output: ``[B * H, N * L, Dv]`` window-only output, overwritten.
        logsumexp: ``[B * H, N * L]`` its log-sum-exp (``-inf``: no window key).
        query_flat: ``[B * H, N * L, D]``.
        global_keys: ``[B * H, G, D]``.
        global_values: ``[B * H, G, Dv]``.
        global_bias: ``[B, N, G]``.

    Returns:
        the joint log-sum-exp ``[B * H, N * L]``.
    """
    BH, NL, _ = query_flat.shape
    B, N, G = global_bias.shape
    # In the log-sum-exp's dtype (float32 for bfloat16 inputs) from here: the steps below
    # meet that log-sum-exp, and mixed-dtype steps take slow paths.
    global_scores = torch.bmm(query_flat, global_keys.transpose(1, 2)).to(logsumexp.dtype).mul_(scale)
    global_scores.view(B, BH // B, N, NL // N, G).add_(global_bias[:, None, :, None, :])  # [B * H, N * L, G]
    window_logsumexp = logsumexp.unsqueeze(-1)  # [B * H, N * L, 1]
    total = torch.logaddexp(window_logsumexp, global_scores.logsumexp(dim=-1, keepdim=True))
    safe_total = total.masked_fill(total == _NEG_INF, float("inf"))  # no key: weights exp(-inf) = 0
    # One dtype on both sides: a float32 factor on a bfloat16 output takes a slow unvectorised
    # path (30 ms for T=16384, H=8 where this takes 2).
    output.mul_((window_logsumexp - safe_total).exp_().to(output.dtype))
    global_probs = (global_scores - safe_total).exp_().to(output.dtype)  # [B * H, N * L, G]
    output.baddbmm_(global_probs, global_values)
    return total.squeeze(-1)


def _global_rows(blocks: Tensor, batch: int, heads: int, global_index: Tensor) -> Tensor:
    """``[B * H * N, L, D]`` blocks -> the global tokens' rows ``[B * H, G, D]`` (a copy)."""
    rows = blocks.view(batch, heads, -1, blocks.shape[-1])[:, :, global_index]  # [B, H, G, D]
    return rows.reshape(batch * heads, global_index.numel(), blocks.shape[-1])


def _global_row_probabilities(
    query_flat: Tensor,
    every_key: Tensor,
    global_index: Tensor,
    key_bias: Tensor,
    scale: float,
    logsumexp: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Softmax of the global tokens' queries over every key.

    Args:
        query_flat: ``[B * H * N, L, D]``.
        every_key: ``[B * H, N * L, D]``.
        global_index: ``[G]``.
        key_bias: ``[B, N * L]``.
        logsumexp: ``[B, H, G]`` from the forward (recomputed when ``None``).

    Returns:
        probabilities ``[B * H, G, N * L]`` (zero in rows without a key) and the
        log-sum-exp ``[B, H, G]`` (``-inf`` in such rows).
    """
    B, NL = key_bias.shape
    BH, _, D = every_key.shape
    G = global_index.numel()
    queries = _global_rows(query_flat, B, BH // B, global_index)  # [B * H, G, D]
    scores = torch.bmm(queries, every_key.transpose(1, 2)).mul_(scale)  # [B * H, G, N * L]
    scores.view(B, BH // B, G, NL).add_(key_bias[:, None, None, :])
    if logsumexp is None:
        logsumexp = scores.logsumexp(dim=-1).view(B, BH // B, G)
    safe = logsumexp.masked_fill(logsumexp == _NEG_INF, float("inf")).view(BH, G, 1)
    probs = scores.sub_(safe).exp_()  # small: G rows
    return probs, logsumexp


def _window_gradients(
    query_flat: Tensor,
    keys: _Windows,
    values: _Windows,
    bias: _BlockBias,
    grad_flat: Tensor,
    output: Tensor,
    logsumexp: Tensor,
    scale: float,
    spread: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The window part of the backward in torch ops, chunk by chunk.

    ``logsumexp`` ``[n, L]`` is the forward's, ``+inf`` in rows without a key.

    Returns:
        the gradients of the queries ``[n, L, D]``, of the key and value blocks in
        sequence order ``[n, L, D]``, ``[n, L, Dv]``, and ``rowsum(dO * O)`` ``[n, L, 1]``.
    """
    n, L, D = query_flat.shape
    Dv, W, w = values.D, spread * L, (spread - 1) // 2
    window_bias = bias.window_bias
    # The softmax backward's row term: dS = P * (dP - rowsum(dO * O)), filled chunk by chunk.
    row_term = output.new_empty(n, L, 1)
    # In bfloat16 the scores are bfloat16 and the log-sum-exp float32: a mixed-dtype
    # subtraction takes a slow unvectorised path (half the backward at T=16384). The
    # log-sum-exp is rounded to the scores' dtype instead; splitting off the rounding
    # as a factor on the probabilities measured no more accurate against float64.
    lse_in_scores = logsumexp.to(query_flat.dtype).unsqueeze(-1)  # [n, L, 1]

    grad_query = query_flat.new_empty(n, L, D)
    # Window offset o of block i is padded block i + o; each padded block from 2w on is
    # first written by offset 2w (copied), before the smaller offsets add to it.
    grad_key_padded = query_flat.new_empty(n + 2 * w, L, D)
    grad_value_padded = query_flat.new_empty(n + 2 * w, L, Dv)
    grad_key_padded[: 2 * w].zero_()
    grad_value_padded[: 2 * w].zero_()
    chunk = _chunk_size(L, W, n)
    scores_buffer = query_flat.new_empty(chunk, L, W)  # the buffers are reused by every chunk
    scores_grad_buffer = query_flat.new_empty(chunk, L, W)
    window_grad = query_flat.new_empty(chunk, W, max(D, Dv))
    for start, stop in _chunks(n, chunk, keys.first, keys.stop):
        count = stop - start
        grad_out = grad_flat[start:stop]  # [c, L, Dv]
        torch.linalg.vecdot(grad_out, output[start:stop], out=row_term[start:stop, :, 0])
        queries = query_flat[start:stop]  # [c, L, D]
        key_windows = keys.windows(start, stop)  # [c, W, D]
        value_windows = values.windows(start, stop)  # [c, W, Dv]
        probs = scores_buffer[:count]
        torch.baddbmm(probs, queries, key_windows.transpose(1, 2), beta=0, alpha=scale, out=probs)
        probs.sub_(lse_in_scores[start:stop])  # S - lse
        biased = [block - start for block in bias.between(bias.biased, start, stop)]
        if biased:
            # exp of -inf (or of anything out of float range) takes a slow scalar path:
            # removed keys get score 0 here and probability 0 after the exp.
            block_bias = window_bias[bias.rows[start:stop][biased]][:, None, :]  # [m, 1, W]
            allowed = block_bias != _NEG_INF
            probs[biased] = (probs[biased] + block_bias).masked_fill_(~allowed, 0.0)
        probs.exp_()  # [c, L, W]
        if biased:
            probs[biased] = probs[biased].mul_(allowed)

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
    return grad_query, grad_key_padded[w : w + n], grad_value_padded[w : w + n], row_term


class _BlockWindowAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, query, key, value, window_bias, global_bias, global_index, key_bias, block_size, window, scale
    ):
        B, H, T, D = query.shape
        Dv = value.shape[-1]
        L, w = block_size, window
        N = window_bias.shape[0] // B
        n, W, G = B * H * N, (2 * w + 1) * L, global_index.numel()

        query_flat = _flat_blocks(query, N, L)  # [n, L, D]
        keys = _Windows.of(key, N, L, w)
        values = _Windows.of(value, N, L, w)
        bias = _BlockBias(window_bias, H, N)
        global_keys = key[:, :, global_index].reshape(B * H, G, D)  # [B * H, G, D]
        global_values = value[:, :, global_index].reshape(B * H, G, Dv)  # [B * H, G, Dv]
        chunk = _chunk_size(L, W, n)

        flash = _flash_with_logsumexp(query) if Dv == D else None  # it takes one head dim
        path, native = window_kernel(query, Dv, L, G > 0, scale)  # which kernel serves, and its operators
        global_rows = None  # the global tokens' rows: output [B * H, G, Dv], log-sum-exp [B * H, G]
        if path == "amx":
            # AMX CPUs: windows, global keys and global rows in one kernel of our own.
            global_queries = _global_rows(query_flat, B, H, global_index)  # [B * H, G, D]
            output, logsumexp, *global_rows = native.forward(
                query_flat, keys.source, values.source, keys.shift, values.shift, 2 * w + 1, H, N,
                window_bias.float().contiguous(), bias.row_biased,
                global_keys.contiguous(), global_values.contiguous(), global_bias.float().contiguous(),
                global_queries, key_bias.float().contiguous(), scale,
            )  # [n, L, Dv], [n, L], [B * H, G, Dv], [B * H, G]
        elif path == "portable":
            # float32 elsewhere: the windows and the global keys in the portable kernel.
            output, logsumexp = native.forward(
                query_flat, keys.source, values.source, keys.shift, values.shift, 2 * w + 1, H, N,
                window_bias.contiguous(), bias.row_biased, global_keys.transpose(1, 2).contiguous(),
                global_values.contiguous(), global_bias.contiguous(), scale,
            )  # [n, L, Dv], [n, L]
        elif flash is not None:
            # The windows through torch's fused kernel, then the global keys merged in exactly.
            output, logsumexp = _fused_window_attention(flash, query_flat, keys, values, bias, scale)
            if G:
                logsumexp = _merge_global_keys(
                    output.view(B * H, N * L, Dv),
                    logsumexp.view(B * H, N * L),
                    query_flat.view(B * H, N * L, D),
                    global_keys,
                    global_values,
                    global_bias.view(B, N, G),
                    scale,
                ).view(n, L)
        else:
            # Without that kernel: GEMM -> bias -> softmax -> GEMM for every block.
            output = query.new_empty(n, L, Dv)
            logsumexp = query.new_empty(n, L, dtype=torch.promote_types(query.dtype, torch.float32))
            scores = query_flat.new_empty(chunk, L, W)  # reused by every chunk
            for start, stop in _chunks(n, chunk, keys.first, keys.stop):
                rows = bias.rows[start:stop]
                head_of_block = torch.arange(start, stop, device=query.device) // N  # [c]
                probs, global_probs, logsumexp[start:stop] = _probabilities(
                    scores[: stop - start],
                    query_flat[start:stop],
                    keys.windows(start, stop),
                    scale,
                    window_bias[rows] if bias.between(bias.biased, start, stop) else None,
                    global_keys[head_of_block] if G else None,
                    global_bias[rows] if G else None,
                )  # [c, L, W], [c, L, G] | None, [c, L]
                torch.bmm(probs, values.windows(start, stop), out=output[start:stop])
                if G:
                    output[start:stop].baddbmm_(global_probs, global_values[head_of_block])

        row_logsumexp = logsumexp.new_empty(B, H, 0)
        if G:
            # The global tokens' queries attend every key: [B, H, G, N * L] scores.
            if global_rows is None:
                row_probs, row_logsumexp = _global_row_probabilities(
                    query_flat, keys.sequence(B, H), global_index, key_bias, scale
                )  # [B * H, G, N * L], [B, H, G]
                global_rows = (torch.bmm(row_probs, values.sequence(B, H)), row_logsumexp)
            row_output, row_logsumexp = global_rows[0].view(B, H, G, Dv), global_rows[1].view(B, H, G)
            output.view(B, H, N * L, Dv)[:, :, global_index] = row_output
            # Their block rows are replaced: probability 0 there (lse = +inf) in the backward.
            logsumexp.view(B, H, N * L)[:, :, global_index] = float("inf")

        ctx.save_for_backward(
            query_flat, keys.source, values.source, output, logsumexp, window_bias, global_bias,
            global_index, global_keys, global_values, key_bias, row_logsumexp,
        )
        ctx.sizes = (B, H, T, N, L, w, scale, keys.shift, values.shift)
        ctx.kernel = (path, native)  # the backward takes the forward's path
        return output.view(B, H, N * L, Dv)[:, :, :T]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        # as the forward (block_sparse_attention): torch's path on the free cores, a native
        # kernel on torch's threads
        with threads_for_load() if ctx.kernel[0] == "torch" else contextlib.nullcontext():
            return _BlockWindowAttention._backward(ctx, grad_output)

    @staticmethod
    def _backward(ctx, grad_output):
        (
            query_flat, key_source, value_source, output, logsumexp, window_bias, global_bias,
            global_index, global_keys, global_values, key_bias, row_logsumexp,
        ) = ctx.saved_tensors
        B, H, T, N, L, w, scale, key_shift, value_shift = ctx.sizes
        n, D, Dv, G = query_flat.shape[0], query_flat.shape[-1], value_source.shape[-1], global_index.numel()
        spread = 2 * w + 1
        bias = _BlockBias(window_bias, H, N)

        grad_flat = _flat_blocks(grad_output, N, L)  # [n, L, Dv]
        # P = exp(S - lse) from the forward's log-sum-exp: no softmax pass. Rows without
        # any key take lse = +inf, so that their probabilities are exp(-inf) = 0.
        logsumexp = logsumexp.masked_fill(logsumexp == _NEG_INF, float("inf"))  # [n, L]

        def sequence_layout(blocks: Tensor) -> Tensor:
            return blocks.view(B, H, N * L, -1)[:, :, :T]  # [B, H, T, D]

        def global_rows(blocks: Tensor) -> Tensor:  # [n, L, D] -> [B * H, G, D]
            return _global_rows(blocks, B, H, global_index)

        path, native = ctx.kernel
        if path == "amx":
            # Everything in the kernel of our own (AMX CPUs). The global tokens' own
            # gradients come back apart, in float32, and join the sequence's here.
            global_grad, global_output = global_rows(grad_flat), global_rows(output)  # [B * H, G, Dv]
            grad_query, grad_key_blocks, grad_value_blocks, *global_grads = native.backward(
                query_flat, key_source, value_source, key_shift, value_shift, spread, H, N,
                window_bias.float().contiguous(), bias.row_biased, grad_flat.contiguous(),
                output.contiguous(), logsumexp.float(), global_keys.contiguous(), global_values.contiguous(),
                global_bias.float().contiguous(), global_rows(query_flat), global_grad,
                torch.linalg.vecdot(global_grad.float(), global_output.float()),  # rowsum(dO * O): [B * H, G]
                # float32 whichever path the forward took (torch's gives the scores' dtype)
                row_logsumexp.reshape(B * H, G).float().contiguous(), key_bias.float().contiguous(), scale,
            )  # [n, L, D], [n, L, D], [n, L, Dv], and [B * H, G, D], [B * H, G, Dv], [B * H, G, D]
            grad_key, grad_value = sequence_layout(grad_key_blocks), sequence_layout(grad_value_blocks)
            if G:
                global_key_grad, global_value_grad, global_query_grad = (
                    x.to(query_flat.dtype).view(B, H, G, -1) for x in global_grads
                )
                grad_key.index_add_(2, global_index, global_key_grad)  # buffers of our own
                grad_value.index_add_(2, global_index, global_value_grad)
                grad_query.view(B, H, N * L, D)[:, :, global_index] = global_query_grad
            return sequence_layout(grad_query), grad_key, grad_value, None, None, None, None, None, None, None

        # Elsewhere the windows and the global keys in the portable kernel (float32), or the
        # windows in torch ops chunk by chunk and the global keys over whole heads; the global
        # tokens' own rows in torch ops.
        keys = _Windows(key_source, key_shift, n, w)
        values = _Windows(value_source, value_shift, n, w)
        if path == "portable":
            grad_query, grad_key_blocks, grad_value_blocks, global_key_grad, global_value_grad, row_term = (
                native.backward(
                    query_flat, key_source, value_source, key_shift, value_shift, spread, H, N,
                    window_bias.contiguous(), bias.row_biased, global_keys.contiguous(),
                    global_keys.transpose(1, 2).contiguous(), global_values.contiguous(),
                    global_bias.contiguous(), grad_flat.contiguous(), output, logsumexp, scale,
                )
            )  # [n, L, D], [n, L, D], [n, L, Dv], [B * H, G, D], [B * H, G, Dv], [n, L]
            row_term = row_term.unsqueeze(-1)  # rowsum(dO * O): [n, L, 1]
        else:
            grad_query, grad_key_blocks, grad_value_blocks, row_term = _window_gradients(
                query_flat, keys, values, bias, grad_flat, output, logsumexp, scale, spread
            )
        grad_key, grad_value = sequence_layout(grad_key_blocks), sequence_layout(grad_value_blocks)
        if G and path == "portable":
            grad_key.index_add_(2, global_index, global_key_grad.view(B, H, G, D))  # buffers of our own
            grad_value.index_add_(2, global_index, global_value_grad.view(B, H, G, Dv))
        elif G:
            # Every query of head (b, h) against its G global keys at once: [B * H, N * L, G].
            queries = query_flat.view(B * H, N * L, D)
            grad_out = grad_flat.view(B * H, N * L, Dv)
            global_probs = torch.bmm(queries, global_keys.transpose(1, 2)).mul_(scale)
            global_probs.view(B, H, N, L, G).add_(global_bias.view(B, 1, N, 1, G))
            global_probs = (global_probs - logsumexp.view(B * H, N * L, 1)).exp_().to(query_flat.dtype)
            grad_global_values = torch.bmm(global_probs.transpose(1, 2), grad_out)  # [B * H, G, Dv]
            global_scores_grad = torch.bmm(grad_out, global_values.transpose(1, 2))  # [B * H, N * L, G]
            global_scores_grad.sub_(row_term.view(B * H, N * L, 1)).mul_(global_probs)
            grad_query.view(B * H, N * L, D).baddbmm_(global_scores_grad, global_keys, alpha=scale)
            # [B * H, G, D]
            grad_global_keys = torch.bmm(global_scores_grad.transpose(1, 2), queries).mul_(scale)
            grad_key.index_add_(2, global_index, grad_global_keys.view(B, H, G, D))  # buffers of our own
            grad_value.index_add_(2, global_index, grad_global_values.view(B, H, G, Dv))
        if G:
            # The global tokens' rows over every key.
            queries, grad_out = global_rows(query_flat), global_rows(grad_flat)  # [B * H, G, D | Dv]
            row_probs, _ = _global_row_probabilities(
                query_flat, keys.sequence(B, H), global_index, key_bias, scale, row_logsumexp
            )  # [B * H, G, N * L]
            every_value_grad = grad_value_blocks.view(B * H, N * L, Dv)
            every_value_grad.baddbmm_(row_probs.transpose(1, 2), grad_out)  # += P^T dO
            row_scores_grad = torch.bmm(grad_out, values.sequence(B, H).transpose(1, 2))  # [B * H, G, N * L]
            row_term_rows = global_rows(row_term)  # [B * H, G, 1]
            row_scores_grad.sub_(row_term_rows).mul_(row_probs)  # dS
            grad_query.view(B, H, N * L, D)[:, :, global_index] = torch.bmm(
                row_scores_grad, keys.sequence(B, H)
            ).mul_(scale).view(B, H, G, D)
            every_key_grad = grad_key_blocks.view(B * H, N * L, D)
            every_key_grad.baddbmm_(row_scores_grad.transpose(1, 2), queries, alpha=scale)  # += scale dS^T Q
        return sequence_layout(grad_query), grad_key, grad_value, None, None, None, None, None, None, None
