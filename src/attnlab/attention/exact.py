"""Attention with its exact per-head weights, block by block of query rows.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key-value heads, ``T`` query
length, ``S`` key length, ``D`` head dim.

:func:`exact_attention` computes ``softmax(Q K^T * scaling [softcap] + position_bias +
mask [, sinks]) V`` in the order of transformers' ``eager`` functions and hands each
block of query rows' weights to a callback, so that statistics never hold a layer's
``[B, H, T, S]`` at once. The inspection function that serves attnlab's own modules and
transformers' alike (:mod:`attnlab.inspect.compute.routing`) runs it wherever weights
are wanted.

A query row with no key to attend to gets zero weights and zero output (attnlab's
rule everywhere; transformers' eager spreads it uniformly over masked keys).
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _large_buffers as large_buffers
from .. import _native
from .._dispatch import native_unavailable_reason

__all__ = ["exact_attention", "query_rows_of"]

_CAUSAL_SOFTMAX = "causal_softmax"


def query_rows_of(tensor: Optional[Tensor], rows: Union[slice, Tensor]) -> Optional[Tensor]:
    """The rows ``rows`` (a slice, or positions ``[R]``) of a ``[.., T|1, S]`` mask, bias or
    per-row sinks (a broadcast row stays as it is)."""
    if tensor is None or tensor.shape[-2] == 1:
        return tensor
    if isinstance(rows, Tensor):
        return tensor.index_select(-2, rows.to(tensor.device))
    return tensor[..., rows, :]


def exact_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    *,
    scaling: Optional[float],
    dropout: float = 0.0,
    causal: bool = False,
    softcap: Optional[float] = None,
    position_bias: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    rows_per_block: Optional[int] = None,
    keep_weights: bool = False,
    on_block: Optional[Callable[[Tensor, int, int, int], None]] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Attention with explicit weights, block by block of query rows.

    Args:
        attention_mask: bool (``True`` = may attend) or additive float, ``[B|1, 1|H, T|1, S]``.
        causal: apply a causal mask (``s <= t``, top-left as ``is_causal`` in torch).
        softcap: scores become ``softcap * tanh(scores / softcap)`` (Gemma 2).
        position_bias: additive ``[B|1, H, T, S]`` (T5).
        sinks: ``[H]`` logits of a virtual key that takes mass but gives no value (GPT-OSS), or
            ``[B, H, T, 1]``: one per query row (Inkling 2, computed from the hidden states).
        rows_per_block: query rows per block (all at once when ``None``).
        keep_weights: return the weights (else ``None`` comes back in their place).
        on_block: called with each block's weights ``[B, H, t, s]`` (``s <= S``: a causal
            block stops at its last row's key, the rest being zeros), its first row, ``T``
            and ``S`` (the statistics mode reduces them there).

    Returns:
        ``(output [B, T, H, D], weights [B, H, T, S] or None)``.
    """
    B, H, T, D = query.shape
    K, S = key.shape[1], key.shape[2]
    groups = H // K
    scaling = 1.0 / math.sqrt(D) if scaling is None else scaling
    # A causal map with no other mask is computed in blocks of rows against the keys up to
    # the block's last row only: the part above the diagonal, about half the products and
    # passes, is never computed (eager computes it and masks it away).
    # (Not when the kept weights must carry gradients to the output: blocks written into one
    # buffer would leave the buffer outside the graph.)
    keeps_graph = keep_weights and torch.is_grad_enabled() and query.requires_grad
    triangular = causal and attention_mask is None and T > 1 and not keeps_graph
    step = T if rows_per_block is None else max(1, rows_per_block)
    if triangular:
        step = min(step, max(64, -(-T // 8)))
    single = step >= T
    # The plain causal map in float32 without gradients (a language model's weights): attnlab's
    # native causal softmax, in place, on grouped products (_in_place_causal_attention).
    in_place = _in_place_causal_softmax() if (
        triangular and softcap is None and sinks is None and position_bias is None
        and query.dtype == torch.float32 and query.device.type == "cpu"
        and not (dropout > 0.0 and module.training)
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))) else None
    if in_place is not None:
        return _in_place_causal_attention(query, key, value, scaling, step, keep_weights, on_block, in_place)
    # Grouped heads: each key-value head serves g consecutive query heads, as transformers'
    # repeat_kv lays them out (the same products as eager, to its last bit)
    key = key[:, :, None].expand(B, K, groups, S, D).reshape(B, H, S, D)
    value = value[:, :, None].expand(B, K, groups, S, value.shape[-1]).reshape(B, H, S, -1)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        # eager's masks write "may not attend" as the dtype's lowest value: read as -inf, so that
        # a row with no admissible key is found (zeros, not a uniform row)
        floor = torch.finfo(attention_mask.dtype).min / 2
        attention_mask = attention_mask.float()
        attention_mask = attention_mask.masked_fill(attention_mask <= floor, float("-inf"))
    outputs, kept = [], []
    # Several blocks write their outputs straight into one buffer: kept apart until a final
    # concatenation, they would sit between the blocks' freed temporaries (which grow with
    # each causal block's keys) and keep the allocator from reusing that memory: a 16k-token
    # statistics pass grew the heap by 15 GiB, against 0.25 GiB with the buffer.
    grad = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    written = None if single or grad else query.new_empty(B, H, T, value.shape[-1], dtype=value.dtype)
    full = None  # the kept weights, when blocks of rows are written into them
    for start in range(0, T, step):
        rows = slice(start, min(T, start + step))
        t = rows.stop - rows.start
        keys = min(S, rows.stop) if triangular else S  # the keys up to the block's last row
        block = query[:, :, rows]
        # the softmax runs in float32, as transformers' eager functions do; every step on
        # the [B, H, t, S] scores works in place (a fresh tensor of that size per step
        # costs page faults on top of the pass itself)
        if triangular and softcap is None and sinks is None:  # scale the [B, H, t, D] queries, not the scores
            scores = torch.matmul(block * scaling, key[:, :, :keys].transpose(-2, -1)).float()  # [B, H, t, keys]
        else:  # eager's order, to its last bit: the soft-capped and sink models have no sdpa to match
            scores = torch.matmul(block, key[:, :, :keys].transpose(-2, -1)).mul_(scaling).float()
        if softcap is not None:  # out of place: tanh keeps its output for the backward
            scores = torch.tanh(scores / softcap) * softcap
        if position_bias is not None:
            scores.add_(query_rows_of(position_bias, rows)[..., :keys])
        allowed, additive_mask = None, False
        if attention_mask is not None:
            block_mask = query_rows_of(attention_mask, rows)
            if block_mask.dtype == torch.bool:
                allowed = block_mask
            else:
                scores.add_(block_mask)
                additive_mask = True
        if causal:
            # only the last t columns can lie above the diagonal: mask those alone
            positions = torch.arange(start, rows.stop, device=query.device)[:, None]  # [t, 1]
            first = max(0, keys - t) if triangular else 0
            below = torch.arange(first, keys, device=query.device)[None, :] <= positions  # [t, keys - first]
            if triangular:
                scores[..., first:].masked_fill_(~below, float("-inf"))
            else:
                allowed = below if allowed is None else allowed & below
        if allowed is not None:  # as 0 / -inf: a broadcast add is faster than a broadcast masked_fill
            scores.add_(torch.zeros(allowed.shape, dtype=scores.dtype, device=scores.device)
                        .masked_fill_(~allowed, float("-inf")))
        # Rows without an admissible key get finite scores for the softmax and zero weights
        # after it; read from the (head-broadcast) mask where that is all there is.
        if triangular:
            empty = None  # every row keeps its own position
        elif allowed is not None and not additive_mask and position_bias is None:
            empty = ~allowed.any(-1, keepdim=True)  # [B|1, 1|H, t, 1]: only the mask can empty a row
        else:
            empty = torch.isneginf(scores).all(-1, keepdim=True)  # [B, H, t, 1]
        has_empty = empty is not None and bool(empty.any())
        if has_empty:
            scores.masked_fill_(empty, 0.0)
        if sinks is not None:
            # one logit per head (GPT-OSS), or per head and query row (Inkling 2: [B, H, T, 1])
            sink = sinks.reshape(1, H, 1, 1) if sinks.dim() == 1 else query_rows_of(sinks, rows)
            sink = sink.to(scores.dtype).expand(B, H, t, 1)
            combined = torch.cat([scores, sink], dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            weights = F.softmax(combined, dim=-1)[..., :-1]
        else:
            weights = F.softmax(scores, dim=-1)
        del scores
        if has_empty:
            weights = weights.masked_fill(empty, 0.0)
        weights = weights.to(query.dtype)
        if dropout > 0.0 and module.training:
            weights = F.dropout(weights, p=dropout)
        _emit(torch.matmul(weights, value[:, :, :keys]), rows, written, outputs)  # [B, H, t, D]
        if on_block is not None:
            on_block(weights, start, T, S)
        if keep_weights and single and keys == S:
            kept.append(weights)
        elif keep_weights:
            if full is None:  # every block writes its rows up to its keys; past them stays zero
                full = large_buffers.zeros((B, H, T, S), weights.dtype, weights.device)
            full[:, :, rows, :keys] = weights
    output = written if written is not None else outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    weights = full if full is not None else (kept[0] if kept else None)
    return output.transpose(1, 2).contiguous(), weights  # [B, T, H, D]


def _emit(block: Tensor, rows: slice, written: Optional[Tensor], outputs: list[Tensor]) -> None:
    """One block of rows' output ``[B, H, t, D]``: into ``written``, else kept in ``outputs``."""
    if written is not None:
        written[:, :, rows] = block
    else:
        outputs.append(block)


def _in_place_causal_attention(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, step: int, keep_weights: bool,
    on_block: Optional[Callable[[Tensor, int, int, int], None]], softmax: Callable[[Tensor, int], Tensor],
) -> tuple[Tensor, Optional[Tensor]]:
    """The plain causal map (float32, no gradients, no mask, ``S >= T``), ``step`` query rows at
    a time, each block against the keys up to its last row; ``softmax`` is the native in-place
    causal softmax. Returns ``(output [B, T, H, D], weights [B, H, T, S] or None)``.

    Each key-value head's ``g`` query heads sit side by side in one product (``[B * K, g * t, D]``
    against ``[B * K, D, keys]``), so keys and values are never repeated per query head. A block's
    scores land in one contiguous scratch buffer, become weights there, give the block's output
    and are then copied into the kept map. Contiguous operands keep torch's batched GEMM: a product
    written straight into a view of the kept map (rows ``S`` apart) made torch run one small GEMM
    per head instead, each a parallel region of its own, and every region waits for both threads
    (measured on a 2-core AMD EPYC, T = 1024, 32 heads, with other processes running: 4.8 s per
    layer, against 0.25 s on one thread).
    """
    B, H, T, D = query.shape
    K, S, Dv = key.shape[1], key.shape[2], value.shape[-1]
    groups = H // K
    output = query.new_empty(B, T, H, Dv)  # the layout the module reads next: no transpose at the end
    full = large_buffers.zeros((B, H, T, S), query.dtype, query.device) if keep_weights else None
    scratch = query.new_empty(B * H * min(step, T) * S)  # one block's scores, reused by every block
    for start in range(0, T, step):
        rows = slice(start, min(T, start + step))
        t, keys = rows.stop - rows.start, min(S, rows.stop)  # the keys up to the block's last row
        queries = (query[:, :, rows] * scaling).reshape(B * K, groups * t, D)  # [B*K, g*t, D]
        scores = scratch[:B * H * t * keys].view(B * K, groups * t, keys)  # = [B, H, t, keys]
        torch.bmm(queries, key[:, :, :keys].transpose(-2, -1).reshape(B * K, D, keys), out=scores)
        weights = softmax(scores.view(B, H, t, keys), start)  # [B, H, t, keys], zeros past each row's key
        block_output = torch.bmm(scores, value[:, :, :keys].reshape(B * K, keys, Dv))  # [B*K, g*t, Dv]
        output[:, rows] = block_output.view(B, H, t, Dv).transpose(1, 2)  # [B, t, H, Dv]
        if full is not None:  # past each block's keys the map stays zero
            full[:, :, rows, :keys] = weights
        if on_block is not None:  # before the next block overwrites the scratch
            on_block(weights, start, T, S)
    return output, full


def _in_place_causal_softmax() -> Optional[Callable[[Tensor, int], Tensor]]:
    """attnlab's native in-place causal softmax (``_native/causal_softmax.cpp``), or
    ``None`` where it does not serve (the caller keeps torch's ops: same weights)."""
    if native_unavailable_reason(_CAUSAL_SOFTMAX) is not None:
        return None
    return _native.build(_CAUSAL_SOFTMAX).causal_softmax_
