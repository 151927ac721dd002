"""Block-sparse attention's windows in torch ops: the path for every dtype and device, and
the readable one beside attnlab's kernels (``_block_window_amx``, ``_block_window_portable``).

Dimension letters as in :mod:`._block_window_kernel`, which says how the forward and the
backward go and which path serves a call; ``c`` blocks in one chunk.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._block_layout import BlockBias, BlockWindows, global_token_rows

__all__ = [
    "add_global_row_gradients",
    "chunked_window_attention",
    "fused_window_attention",
    "global_key_gradients",
    "global_row_probabilities",
    "merge_global_keys",
    "window_gradients",
]

_NEG_INF = float("-inf")


def window_probabilities(
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


def chunk_bounds(count: int, chunk: int, first: int, stop: int) -> list[tuple[int, int]]:
    """``[start, stop)`` chunks of ``count`` blocks, in order; the blocks without a window
    view (``< first`` or ``>= stop``) in chunks of their own, so that only they are copied."""
    first, stop = min(max(first, 0), count), min(max(stop, 0), count)
    stop = max(stop, first)
    bounds = [(0, first)] if first else []
    bounds += [(start, min(stop, start + chunk)) for start in range(first, stop, chunk)]
    bounds += [(start, min(count, start + chunk)) for start in range(stop, count, chunk)]
    return bounds


def consecutive_runs(blocks: list[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` runs of consecutive blocks in sorted ``blocks``."""
    runs: list[tuple[int, int]] = []
    for block in blocks:
        if runs and runs[-1][1] == block:
            runs[-1] = (runs[-1][0], block + 1)
        else:
            runs.append((block, block + 1))
    return runs


def fused_window_attention(
    flash, query_flat: Tensor, keys: BlockWindows, values: BlockWindows, bias: BlockBias, scale: float
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
    for start, end in consecutive_runs(biased):
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


def chunked_window_attention(
    query_flat: Tensor,
    keys: BlockWindows,
    values: BlockWindows,
    bias: BlockBias,
    global_keys: Tensor,
    global_values: Tensor,
    global_bias: Tensor,
    scale: float,
    blocks: int,
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """Every block over its window keys and the global keys, GEMM -> bias -> softmax -> GEMM,
    ``chunk`` blocks at a time (where torch's fused kernel is missing): ``[n, L, Dv]``, ``[n, L]``.

    Args:
        query_flat: ``[n, L, D]``.
        global_keys: ``[B * H, G, D]``.
        global_values: ``[B * H, G, Dv]``.
        global_bias: ``[B * N, G]``.
        blocks: ``N``.
    """
    n, L, _ = query_flat.shape
    G = global_keys.shape[1]
    output = query_flat.new_empty(n, L, values.D)
    logsumexp = query_flat.new_empty(n, L, dtype=torch.promote_types(query_flat.dtype, torch.float32))
    scores = query_flat.new_empty(chunk, L, keys.width)  # reused by every chunk
    for start, stop in chunk_bounds(n, chunk, keys.first, keys.stop):
        rows = bias.rows[start:stop]
        head_of_block = torch.arange(start, stop, device=query_flat.device) // blocks  # [c]
        probs, global_probs, logsumexp[start:stop] = window_probabilities(
            scores[: stop - start],
            query_flat[start:stop],
            keys.windows(start, stop),
            scale,
            bias.window_bias[rows] if bias.between(bias.biased, start, stop) else None,
            global_keys[head_of_block] if G else None,
            global_bias[rows] if G else None,
        )  # [c, L, W], [c, L, G] | None, [c, L]
        torch.bmm(probs, values.windows(start, stop), out=output[start:stop])
        if G:
            output[start:stop].baddbmm_(global_probs, global_values[head_of_block])
    return output, logsumexp


def merge_global_keys(
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


def global_row_probabilities(
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
    queries = global_token_rows(query_flat, B, BH // B, global_index)  # [B * H, G, D]
    scores = torch.bmm(queries, every_key.transpose(1, 2)).mul_(scale)  # [B * H, G, N * L]
    scores.view(B, BH // B, G, NL).add_(key_bias[:, None, None, :])
    if logsumexp is None:
        logsumexp = scores.logsumexp(dim=-1).view(B, BH // B, G)
    safe = logsumexp.masked_fill(logsumexp == _NEG_INF, float("inf")).view(BH, G, 1)
    probs = scores.sub_(safe).exp_()  # small: G rows
    return probs, logsumexp


def add_to_windows(target: Tensor, window_grad: Tensor, start: int, spread: int) -> None:
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


def window_gradients(
    query_flat: Tensor,
    keys: BlockWindows,
    values: BlockWindows,
    bias: BlockBias,
    grad_flat: Tensor,
    output: Tensor,
    logsumexp: Tensor,
    scale: float,
    spread: int,
    chunk: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The window part of the backward in torch ops, ``chunk`` blocks at a time.

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
    scores_buffer = query_flat.new_empty(chunk, L, W)  # the buffers are reused by every chunk
    scores_grad_buffer = query_flat.new_empty(chunk, L, W)
    window_grad = query_flat.new_empty(chunk, W, max(D, Dv))
    for start, stop in chunk_bounds(n, chunk, keys.first, keys.stop):
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
        add_to_windows(grad_value_padded, value_grad, start, spread)

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
        add_to_windows(grad_key_padded, key_grad, start, spread)  # [c, W, D] = scale * dS^T Q
    return grad_query, grad_key_padded[w : w + n], grad_value_padded[w : w + n], row_term


def global_key_gradients(
    grad_query: Tensor,
    query_flat: Tensor,
    grad_flat: Tensor,
    global_keys: Tensor,
    global_values: Tensor,
    global_bias: Tensor,
    logsumexp: Tensor,
    row_term: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """The global keys' part of the backward, every query of a head against its ``G``
    global keys at once (``[B * H, N * L, G]``): adds the queries' part to ``grad_query``
    ``[n, L, D]`` in place and returns the global keys' and values' gradients
    ``[B * H, G, D]``, ``[B * H, G, Dv]``.

    ``logsumexp`` ``[n, L]`` is the forward's (``+inf`` in rows without a key), ``row_term``
    ``[n, L, 1]`` is ``rowsum(dO * O)``, ``global_bias`` ``[B * N, G]``.
    """
    n, L, D = query_flat.shape
    BH, G, Dv = global_values.shape
    N = n // BH
    B = global_bias.shape[0] // N
    queries = query_flat.view(BH, N * L, D)
    grad_out = grad_flat.view(BH, N * L, Dv)
    global_probs = torch.bmm(queries, global_keys.transpose(1, 2)).mul_(scale)
    global_probs.view(B, BH // B, N, L, G).add_(global_bias.view(B, 1, N, 1, G))
    global_probs = (global_probs - logsumexp.view(BH, N * L, 1)).exp_().to(query_flat.dtype)
    grad_global_values = torch.bmm(global_probs.transpose(1, 2), grad_out)  # [B * H, G, Dv]
    global_scores_grad = torch.bmm(grad_out, global_values.transpose(1, 2))  # [B * H, N * L, G]
    global_scores_grad.sub_(row_term.view(BH, N * L, 1)).mul_(global_probs)
    grad_query.view(BH, N * L, D).baddbmm_(global_scores_grad, global_keys, alpha=scale)
    grad_global_keys = torch.bmm(global_scores_grad.transpose(1, 2), queries).mul_(scale)  # [B * H, G, D]
    return grad_global_keys, grad_global_values


def add_global_row_gradients(
    grad_query: Tensor,
    grad_key_blocks: Tensor,
    grad_value_blocks: Tensor,
    query_flat: Tensor,
    grad_flat: Tensor,
    keys: BlockWindows,
    values: BlockWindows,
    global_index: Tensor,
    key_bias: Tensor,
    row_logsumexp: Tensor,
    row_term: Tensor,
    scale: float,
) -> None:
    """The backward of the global tokens' own rows (their queries over every key), in place:
    their queries' gradients replace those rows of ``grad_query`` ``[n, L, D]``, and every
    key's and value's part is added to ``grad_key_blocks`` ``[n, L, D]`` and
    ``grad_value_blocks`` ``[n, L, Dv]``.

    ``key_bias`` ``[B, N * L]``, ``row_logsumexp`` ``[B, H, G]`` from the forward,
    ``row_term`` ``[n, L, 1]`` ``rowsum(dO * O)``.
    """
    n, L, D = query_flat.shape
    B, NL = key_bias.shape
    H, G, Dv = n * L // (B * NL), global_index.numel(), values.D
    queries = global_token_rows(query_flat, B, H, global_index)  # [B * H, G, D]
    grad_out = global_token_rows(grad_flat, B, H, global_index)  # [B * H, G, Dv]
    row_probs, _ = global_row_probabilities(
        query_flat, keys.sequence(B, H), global_index, key_bias, scale, row_logsumexp
    )  # [B * H, G, N * L]
    every_value_grad = grad_value_blocks.view(B * H, NL, Dv)
    every_value_grad.baddbmm_(row_probs.transpose(1, 2), grad_out)  # += P^T dO
    row_scores_grad = torch.bmm(grad_out, values.sequence(B, H).transpose(1, 2))  # [B * H, G, N * L]
    row_term_rows = global_token_rows(row_term, B, H, global_index)  # [B * H, G, 1]
    row_scores_grad.sub_(row_term_rows).mul_(row_probs)  # dS
    grad_query.view(B, H, NL, D)[:, :, global_index] = torch.bmm(
        row_scores_grad, keys.sequence(B, H)
    ).mul_(scale).view(B, H, G, D)
    every_key_grad = grad_key_blocks.view(B * H, NL, D)
    every_key_grad.baddbmm_(row_scores_grad.transpose(1, 2), queries, alpha=scale)  # += scale dS^T Q
