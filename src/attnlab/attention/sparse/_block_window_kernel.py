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

Which kernel serves is chosen per call (:func:`attnlab._dispatch.window_kernel`;
``ATTNLAB_SPARSE_KERNEL``), and the backward takes its forward's. In bfloat16 and float32 on
CPUs with AMX the forward and the backward are attnlab's AMX kernel (``_block_window_amx.cpp``:
windows, global keys and the global tokens' rows in one pass each; see
``_block_window_amx.py``). In float32 elsewhere the windows and the global keys are
attnlab's portable kernel (``attnlab/_native/block_window.cpp``, see
``_block_window_portable.py``), and the global tokens' own rows torch's ops. Otherwise
the forward attends each run of consecutive blocks in one call of torch's fused CPU
kernel (``_scaled_dot_product_flash_attention_for_cpu``, which also returns the
log-sum-exp): without a mask where the window needs no bias, else with the window bias
as the mask (all windows are read in place; only the batch-edge windows are copied).
The ``G`` global keys are then merged in exactly: with ``lse = logaddexp(lse_window,
lse_global)``, the output is ``exp(lse_window - lse) * out_window + exp(S_global - lse)
@ V_global``, one small ``[T, G]`` score matrix per head (``-inf`` where a global key is
already in the window or is masked). The global tokens' own rows attend every key and
replace their block rows. Where that kernel is missing (other devices) every block
takes GEMM -> bias -> softmax -> GEMM in chunks instead. This file calls the path that
serves; torch's path is in ``_block_window_torch.py``, the block layout all of them read in
``_block_layout.py``.

The backward recomputes the probabilities as ``P = exp(S - lse)`` from the forward's
log-sum-exp (no softmax pass; global keys and masks included, as in the forward), then
``dS = P * (dO V^T - rowsum(dO * O))`` and four GEMMs. Where the kernel does not serve it
runs in torch ops: the windows in chunks of ``c`` blocks whose ``[c, L, W]`` buffers are
reused from chunk to chunk (fresh large buffers cost page faults), the global keys' and
global rows' parts as small GEMMs over whole heads. Memory is ``O(T * D)`` plus one chunk.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from ..._dispatch import window_kernel
from ..._threads import threads_for_load
from ._block_layout import BlockBias, BlockWindows, flat_blocks, global_token_rows
from ._block_window_torch import (
    add_global_row_gradients,
    chunked_window_attention,
    fused_window_attention,
    global_key_gradients,
    global_row_probabilities,
    merge_global_keys,
    window_gradients,
)

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


def _flash_with_logsumexp(query: Tensor):
    """torch's fused CPU attention that also returns the log-sum-exp, or ``None``.

    ``op(q, k, v, dropout_p, is_causal, attn_mask=, scale=)`` -> ``(output [.., T, Dv],
    logsumexp [.., T])``, natural log, float32 for reduced-precision inputs; a row
    whose keys are all masked gives output 0 and log-sum-exp 0 (not ``-inf``).
    """
    if query.device.type != "cpu":
        return None
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _chunk_size(L: int, W: int, count: int) -> int:
    return max(1, min(count, _CHUNK_ELEMENTS // (L * W)))


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

        query_flat = flat_blocks(query, N, L)  # [n, L, D]
        keys = BlockWindows.of(key, N, L, w)
        values = BlockWindows.of(value, N, L, w)
        bias = BlockBias(window_bias, H, N)
        global_keys = key[:, :, global_index].reshape(B * H, G, D)  # [B * H, G, D]
        global_values = value[:, :, global_index].reshape(B * H, G, Dv)  # [B * H, G, Dv]

        flash = _flash_with_logsumexp(query) if Dv == D else None  # it takes one head dim
        path, operators = window_kernel(query, Dv, L, G > 0, scale)  # which kernel serves, and its operators
        global_rows = None  # the global tokens' rows: output [B * H, G, Dv], log-sum-exp [B * H, G]
        if path == "amx":
            # AMX CPUs: windows, global keys and global rows in one kernel of our own.
            global_queries = global_token_rows(query_flat, B, H, global_index)  # [B * H, G, D]
            output, logsumexp, *global_rows = operators.forward(
                query_flat, keys.source, values.source, keys.shift, values.shift, 2 * w + 1, H, N,
                window_bias.float().contiguous(), bias.row_biased,
                global_keys.contiguous(), global_values.contiguous(), global_bias.float().contiguous(),
                global_queries, key_bias.float().contiguous(), scale,
            )  # [n, L, Dv], [n, L], [B * H, G, Dv], [B * H, G]
        elif path == "portable":
            # float32 elsewhere: the windows and the global keys in the portable kernel.
            output, logsumexp = operators.forward(
                query_flat, keys.source, values.source, keys.shift, values.shift, 2 * w + 1, H, N,
                window_bias.contiguous(), bias.row_biased, global_keys.transpose(1, 2).contiguous(),
                global_values.contiguous(), global_bias.contiguous(), scale,
            )  # [n, L, Dv], [n, L]
        elif flash is not None:
            # The windows through torch's fused kernel, then the global keys merged in exactly.
            output, logsumexp = fused_window_attention(flash, query_flat, keys, values, bias, scale)
            if G:
                logsumexp = merge_global_keys(
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
            output, logsumexp = chunked_window_attention(
                query_flat, keys, values, bias, global_keys, global_values, global_bias, scale,
                blocks=N, chunk=_chunk_size(L, W, n),
            )  # [n, L, Dv], [n, L]

        row_logsumexp = logsumexp.new_empty(B, H, 0)
        if G:
            # The global tokens' queries attend every key: [B, H, G, N * L] scores.
            if global_rows is None:
                row_probs, row_logsumexp = global_row_probabilities(
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
        ctx.kernel = (path, operators)  # the backward takes the forward's path
        return output.view(B, H, N * L, Dv)[:, :, :T]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        # as the forward (block_sparse_attention): torch's path on the free cores, a kernel of
        # attnlab's on torch's threads
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
        bias = BlockBias(window_bias, H, N)

        grad_flat = flat_blocks(grad_output, N, L)  # [n, L, Dv]
        # P = exp(S - lse) from the forward's log-sum-exp: no softmax pass. Rows without
        # any key take lse = +inf, so that their probabilities are exp(-inf) = 0.
        logsumexp = logsumexp.masked_fill(logsumexp == _NEG_INF, float("inf"))  # [n, L]

        def sequence_layout(blocks: Tensor) -> Tensor:
            return blocks.view(B, H, N * L, -1)[:, :, :T]  # [B, H, T, D]

        def global_rows(blocks: Tensor) -> Tensor:  # [n, L, D] -> [B * H, G, D]
            return global_token_rows(blocks, B, H, global_index)

        path, operators = ctx.kernel
        if path == "amx":
            # Everything in the kernel of our own (AMX CPUs). The global tokens' own
            # gradients come back apart, in float32, and join the sequence's here.
            global_grad, global_output = global_rows(grad_flat), global_rows(output)  # [B * H, G, Dv]
            grad_query, grad_key_blocks, grad_value_blocks, *global_grads = operators.backward(
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
        keys = BlockWindows(key_source, key_shift, n, w)
        values = BlockWindows(value_source, value_shift, n, w)
        if path == "portable":
            grad_query, grad_key_blocks, grad_value_blocks, global_key_grad, global_value_grad, row_term = (
                operators.backward(
                    query_flat, key_source, value_source, key_shift, value_shift, spread, H, N,
                    window_bias.contiguous(), bias.row_biased, global_keys.contiguous(),
                    global_keys.transpose(1, 2).contiguous(), global_values.contiguous(),
                    global_bias.contiguous(), grad_flat.contiguous(), output, logsumexp, scale,
                )
            )  # [n, L, D], [n, L, D], [n, L, Dv], [B * H, G, D], [B * H, G, Dv], [n, L]
            row_term = row_term.unsqueeze(-1)  # rowsum(dO * O): [n, L, 1]
        else:
            grad_query, grad_key_blocks, grad_value_blocks, row_term = window_gradients(
                query_flat, keys, values, bias, grad_flat, output, logsumexp, scale, spread,
                chunk=_chunk_size(L, spread * L, n),
            )
            if G:
                global_key_grad, global_value_grad = global_key_gradients(
                    grad_query, query_flat, grad_flat, global_keys, global_values, global_bias, logsumexp,
                    row_term, scale,
                )  # [B * H, G, D], [B * H, G, Dv]
        grad_key, grad_value = sequence_layout(grad_key_blocks), sequence_layout(grad_value_blocks)
        if G:
            grad_key.index_add_(2, global_index, global_key_grad.view(B, H, G, D))  # buffers of our own
            grad_value.index_add_(2, global_index, global_value_grad.view(B, H, G, Dv))
            # The global tokens' rows over every key.
            add_global_row_gradients(
                grad_query, grad_key_blocks, grad_value_blocks, query_flat, grad_flat, keys, values,
                global_index, key_bias, row_logsumexp, row_term, scale,
            )
        return sequence_layout(grad_query), grad_key, grad_value, None, None, None, None, None, None, None
