"""The attention kernel every attnlab module calls.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``D`` head dim (``Dv`` for values).

Two paths compute the same function:

* **fused** (``need_weights=False``): ``F.scaled_dot_product_attention``, which on CPU
  and GPU runs a flash-style kernel that never materialises the ``[T, S]`` score matrix.
* **reference** (``need_weights=True``): explicit ``matmul -> softmax -> matmul`` that
  returns the exact per-head attention probabilities.

Both treat a *fully masked* query row (no key may be attended) the same way: its
output and its weights are zero, and gradients through it are zero, never NaN.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .._dropout import dropout
from .._precision import bf16_is_emulated
from .masks import causal_mask, mask_with_bias, validate_attention_bias, validate_attention_mask

__all__ = ["AttentionResult", "attention", "reference_attention", "fused_attention"]


class AttentionResult(NamedTuple):
    """Output of :func:`attention`; unpacks as ``output, weights``.

    Attributes:
        output: ``[B, H, T, Dv]``.
        weights: ``[B, H, T, S]`` attention probabilities (before dropout) when they
            were requested, else ``None``.
    """

    output: Tensor
    weights: Optional[Tensor]


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D [B, H, length, head_dim], got shape {tuple(tensor.shape)}"
            )
    if not (query.dtype == key.dtype == value.dtype) or not query.dtype.is_floating_point:
        raise TypeError(
            "query, key and value must share one floating dtype, got "
            f"{query.dtype}, {key.dtype}, {value.dtype}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query head_dim {query.shape[-1]} must equal key head_dim {key.shape[-1]} "
            f"(query {tuple(query.shape)}, key {tuple(key.shape)})"
        )
    if key.shape[:3] != value.shape[:3]:
        raise ValueError(
            f"key and value must agree in [B, H, S]; got key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if query.shape[:2] != key.shape[:2]:
        raise ValueError(
            f"query and key must agree in [B, H]; got query {tuple(query.shape)}, key {tuple(key.shape)}"
        )


def _rows_with_keys(mask: Tensor) -> Tensor:
    """``[.., T, 1]`` bool: which query rows have at least one key they may attend."""
    if mask.dtype == torch.bool or mask.shape[-1] == 0:
        return mask.bool().any(dim=-1, keepdim=True)
    # The row maximum, not `mask != -inf`: no temporary as large as the scores.
    return mask.amax(dim=-1, keepdim=True) != float("-inf")


def _prepare_mask(
    query: Tensor, key: Tensor, mask: Optional[Tensor], attn_bias: Optional[Tensor], is_causal: bool
) -> tuple[Optional[Tensor], bool]:
    """Validate ``mask`` and ``attn_bias`` and fold them, and a causal constraint when
    either is given, into one rank-4 term for the kernels.

    Returns that term (bool, or additive float when a bias was given; or ``None``) and
    whether ``is_causal`` is still to be passed on to the kernel on its own.
    """
    B, H, T, _ = query.shape
    S = key.shape[2]
    sizes = {"batch": B, "heads": H, "query_len": T, "key_len": S}
    mask = validate_attention_mask(mask, **sizes, name="mask")
    attn_bias = validate_attention_bias(attn_bias, **sizes, dtype=query.dtype)
    if is_causal and (mask is not None or attn_bias is not None):
        causal = causal_mask(T, S, device=query.device)[None, None]  # [1, 1, T, S]
        mask = causal if mask is None else mask & causal
        is_causal = False
    return mask_with_bias(mask, attn_bias), is_causal


def fused_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
) -> Tensor:
    """Attention through ``F.scaled_dot_product_attention``; no weights.

    Fully masked rows are given one harmless key to attend to inside the kernel and
    their output is then multiplied by zero, so forward and backward stay finite.
    ``mask`` is the kernels' one rank-4 term that :func:`attention` prepares: a bool keep
    mask, or an additive bias with ``-inf`` where attention is not allowed.
    """
    if key.shape[2] == 0:
        return query.new_zeros(*query.shape[:3], value.shape[-1])
    keep_rows = None
    if mask is not None:
        rows = _rows_with_keys(mask)  # [B|1, H|1, T|1, 1]
        if not bool(rows.all()):
            keep_rows = rows
            if mask.dtype == torch.bool:
                mask = mask | ~rows
            else:
                mask = mask.masked_fill(~rows, 0.0)
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )  # [B, H, T, Dv]
    if keep_rows is not None:
        output = output * keep_rows.to(output.dtype)
    return output


def reference_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
) -> AttentionResult:
    """Explicit ``softmax(Q K^T * scale + mask) V`` that also returns the weights.

    ``mask`` is the kernels' one rank-4 term that :func:`attention` prepares (a bool keep
    mask, or an additive bias with ``-inf`` where not allowed). The softmax runs in at
    least float32. Weights are returned before dropout.
    """
    T, S = query.shape[2], key.shape[2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # Every step on the [B, H, T, S] scores works in place: a fresh tensor of that size
    # costs page faults on top of the pass itself, and the weights path is all passes.
    scores = torch.matmul(query, key.transpose(-2, -1)).mul_(scale)  # [B, H, T, S]
    rows = None
    if mask is not None and mask.dtype == torch.bool:
        # Which rows keep a key, read from the (usually head- or query-broadcast) mask,
        # then the mask as 0 / -inf: adding a broadcast float is several times faster
        # than a broadcast masked_fill_ over the scores.
        rows = None if is_causal else mask.any(dim=-1, keepdim=True)  # [B|1, H|1, T|1, 1]
        mask = torch.zeros(mask.shape, dtype=scores.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    if mask is not None:
        scores.add_(mask)
    if is_causal:
        scores.masked_fill_(~causal_mask(T, S, device=query.device), float("-inf"))
    if rows is None and (mask is not None or is_causal):
        # Found from the scores, not the mask: a mask and is_causal together can empty a
        # row neither empties alone, and a finite float16 mask such as finfo.min can
        # overflow to -inf once added.
        rows = _rows_with_keys(scores)  # [B, H, T, 1]
    if rows is not None:
        if bool(rows.all()):
            rows = None
        else:
            # A row with no admissible key would be softmax(-inf, ..., -inf) = NaN; give
            # it finite scores and zero its weights afterwards, so gradients stay zero too.
            scores.masked_fill_(~rows, 0.0)
    softmax_dtype = torch.promote_types(scores.dtype, torch.float32)
    weights = F.softmax(scores, dim=-1, dtype=softmax_dtype).to(query.dtype)
    if rows is not None:
        weights = weights.masked_fill(~rows, 0.0)
    dropped = dropout(weights, dropout_p) if dropout_p > 0.0 else weights
    output = torch.matmul(dropped, value)  # [B, H, T, Dv]
    return AttentionResult(output, weights)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    *,
    attn_bias: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    need_weights: bool = False,
) -> AttentionResult:
    """Scaled dot-product attention, ``softmax(Q K^T / sqrt(D) + attn_bias) V`` over the
    keys that ``mask`` allows.

    Runs the fused kernel unless ``need_weights`` is set, in which case the reference
    path computes and returns the exact per-head probabilities.

    Args:
        query: ``[B, H, T, D]``.
        key: ``[B, H, S, D]``.
        value: ``[B, H, S, Dv]``.
        mask: keep mask (``True`` / 1 = may attend; bool, integer or float 0/1),
            broadcastable to ``[B, H, T, S]``: ``[T, S]``, ``[B, T, S]`` or
            ``[B, H, T, S]`` (a ``[B, S]`` padding mask is read as such when ``[T, S]``
            does not fit). See :mod:`attnlab.attention.masks` for the contract.
        attn_bias: additive float term broadcastable to ``[B, H, T, S]`` (``-inf``
            removes a key), such as ALiBi or a relative position bias.
        dropout_p: dropout on the attention probabilities. Pass 0 in evaluation.
            Any value above 0 makes torch leave its flash kernel for a slower path
            that builds the ``[T, S]`` matrix.
        is_causal: also forbid attending to later keys (top-left aligned).
        scale: score scale; defaults to ``1 / sqrt(D)``.
        need_weights: return the attention probabilities.

    Returns:
        :class:`AttentionResult` ``(output [B, H, T, Dv], weights [B, H, T, S] | None)``.
        Rows with no admissible key have zero output and zero weights.

    Example:
        >>> q = k = v = torch.randn(2, 4, 5, 8)
        >>> out, w = attention(q, k, v, need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([2, 4, 5, 8]), torch.Size([2, 4, 5, 5]))
    """
    _check_qkv(query, key, value)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    mask, is_causal = _prepare_mask(query, key, mask, attn_bias, is_causal)
    options = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
    if not bf16_is_emulated(query):
        return _run_path(query, key, value, mask, need_weights, options)
    # No native bfloat16 on this CPU: torch's bfloat16 kernels here are emulated and many
    # times slower than float32 (see attnlab._precision). Attend in float32.
    if mask is not None and mask.dtype.is_floating_point:
        mask = mask.float()
    with torch.autocast("cpu", enabled=False):
        output, weights = _run_path(query.float(), key.float(), value.float(), mask, need_weights, options)
    return AttentionResult(output.to(query.dtype), None if weights is None else weights.to(query.dtype))


def _run_path(
    query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor], need_weights: bool, options: dict
) -> AttentionResult:
    """The reference path when weights are wanted, else the fused one; inputs already checked."""
    if need_weights:
        return reference_attention(query, key, value, mask, **options)
    return AttentionResult(fused_attention(query, key, value, mask, **options), None)
