"""The attention function attnlab registers with transformers.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key-value heads, ``T`` query
length, ``S`` key length, ``D`` head dim.

Every attention module of a transformers model (5.x) calls one function from
``ALL_ATTENTION_FUNCTIONS`` with ``(module, query, key, value, attention_mask, dropout=,
scaling=, **kwargs)``: ``query`` ``[B, H, T, D]``, ``key`` / ``value`` ``[B, K, S, D]``,
returning ``(output [B, T, H, D], weights [B, H, T, S] or None)``. attnlab's function
serves two paths:

* **fused**: transformers' own ``sdpa`` function, so that a layer nobody looks at gives
  exactly what ``attn_implementation="sdpa"`` gives;
* **exact**: ``softmax(Q K^T * scaling [softcap] + position_bias + mask [, sinks]) V``
  in the order of transformers' ``eager`` functions, returning the per-head weights
  (kept, or reduced to statistics block by block of query rows, so that a long input
  never holds a layer's ``[B, H, T, S]`` at once). Soft-capped scores and attention
  sinks have no fused kernel: they always take this path.

A query row with no key to attend to gets zero weights and zero output (attnlab's
rule everywhere; transformers' eager spreads it uniformly over masked keys).
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _large_buffers as large_buffers
from .. import _native
from .._dispatch import native_unavailable_reason
from ..inspect.compute.head_mask import head_scale_of
from ._routes import route_of

__all__ = ["BACKEND_NAME", "attnlab_attention_forward", "register", "exact_attention", "UnsupportedAttention"]

BACKEND_NAME = "attnlab"

# Keywords that reach the attention function and change nothing in its arithmetic:
# bookkeeping of the model call, or already encoded in the mask that transformers
# builds for this backend (the sliding window, packed sequences), or a flag of another
# kernel (``deterministic``: flash-attn's deterministic backward, which ModernBERT passes
# to every backend).
_IGNORED = frozenset({
    "output_attentions", "output_hidden_states", "use_cache", "return_dict", "cache_position",
    "position_ids", "past_key_values", "past_key_value", "layer_idx", "sliding_window",
    "token_type_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
    "position_embeddings", "layer_head_mask", "is_causal", "encoder_hidden_states",
    "encoder_attention_mask", "output_router_logits", "logits_to_keep", "labels",
    "query_length", "dropout_p", "target_dtype", "attention_type", "q_len", "kv_len", "deterministic",
})


_CAUSAL_SOFTMAX = "causal_softmax"


class UnsupportedAttention(ValueError):
    """An attention call the backend cannot compute exactly (named module and keyword)."""


def _unsupported_keywords(module: nn.Module, kwargs: dict[str, Any]) -> None:
    unknown = sorted(name for name, value in kwargs.items() if name not in _IGNORED and value is not None)
    if unknown:
        raise UnsupportedAttention(
            f"{type(module).__name__} passed {', '.join(repr(name) for name in unknown)} to its attention "
            f"function, which attnlab's backend does not implement; run this model with "
            f"attn_implementation='eager' instead"
        )


def _query_rows(tensor: Optional[Tensor], rows: slice) -> Optional[Tensor]:
    """The rows ``rows`` of a ``[.., T|1, S]`` mask or bias (broadcast rows stay as they are)."""
    if tensor is None or tensor.shape[-2] == 1:
        return tensor
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
    # Grouped heads: each key-value head serves g consecutive query heads, as transformers'
    # repeat_kv lays them out (the same products as eager, to its last bit)
    key = key[:, :, None].expand(B, K, groups, S, D).reshape(B, H, S, D)
    value = value[:, :, None].expand(B, K, groups, S, value.shape[-1]).reshape(B, H, S, -1)
    scaling = 1.0 / math.sqrt(D) if scaling is None else scaling
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        # eager's masks write "may not attend" as the dtype's lowest value: read as -inf, so that
        # a row with no admissible key is found (zeros, not a uniform row)
        floor = torch.finfo(attention_mask.dtype).min / 2
        attention_mask = attention_mask.float()
        attention_mask = attention_mask.masked_fill(attention_mask <= floor, float("-inf"))
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
    # The plain causal map in float32 without gradients (a language model's weights): each
    # block's products go straight where they are kept and become weights there, in place
    # (attnlab's native causal softmax), rather than through a scores tensor, a softmax
    # output and a copy.
    in_place = _in_place_causal_softmax() if (
        triangular and softcap is None and sinks is None and position_bias is None
        and query.dtype == torch.float32 and query.device.type == "cpu"
        and not (dropout > 0.0 and module.training)
        and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad))) else None
    outputs, kept = [], []
    full = None  # the kept weights, when blocks of rows are written into them
    for start in range(0, T, step):
        rows = slice(start, min(T, start + step))
        t = rows.stop - rows.start
        keys = min(S, rows.stop) if triangular else S  # the keys up to the block's last row
        block = query[:, :, rows]
        if in_place is not None:
            products = (block * scaling, key[:, :, :keys].transpose(-2, -1))
            if keep_weights:
                if full is None:  # every block writes its rows up to its keys; past them stays zero
                    full = large_buffers.zeros((B, H, T, S), query.dtype, query.device)
                weights = in_place(torch.matmul(*products, out=full[:, :, rows, :keys]), start)
            else:
                weights = in_place(torch.matmul(*products), start)
            outputs.append(torch.matmul(weights, value[:, :, :keys]))  # [B, H, t, D]
            if on_block is not None:
                on_block(weights, start, T, S)
            continue
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
            scores.add_(_query_rows(position_bias, rows)[..., :keys])
        allowed, additive_mask = None, False
        if attention_mask is not None:
            block_mask = _query_rows(attention_mask, rows)
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
            sink = sinks.reshape(1, H, 1, 1) if sinks.dim() == 1 else _query_rows(sinks, rows)
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
        outputs.append(torch.matmul(weights, value[:, :, :keys]))  # [B, H, t, D]
        if on_block is not None:
            on_block(weights, start, T, S)
        if keep_weights and single and keys == S:
            kept.append(weights)
        elif keep_weights:
            if full is None:  # every block writes its rows up to its keys; past them stays zero
                full = large_buffers.zeros((B, H, T, S), weights.dtype, weights.device)
            full[:, :, rows, :keys] = weights
    output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)
    weights = full if full is not None else (kept[0] if kept else None)
    return output.transpose(1, 2).contiguous(), weights  # [B, T, H, D]


def _in_place_causal_softmax() -> Optional[Callable[[Tensor, int], Tensor]]:
    """attnlab's native in-place causal softmax (``_native/causal_softmax.cpp``), or
    ``None`` where it does not serve (the caller keeps torch's ops: same weights)."""
    if native_unavailable_reason(_CAUSAL_SOFTMAX) is not None:
        return None
    return _native.build(_CAUSAL_SOFTMAX).causal_softmax_


@functools.cache
def _builds_causal_masks(attention_class: type) -> bool:
    """Whether the model of an attention class that sets no ``is_causal`` is causal, read from
    its modeling file: one that builds only bidirectional masks is not.

    transformers' sdpa takes such a module as causal, and where the mask builder leaves out an
    all-ones mask (a batch without padding) Splinter's, ALIGN's and CLAP's text encoders then
    attended causally: their outputs and weights differed from eager's (found by the census).
    """
    try:
        source = inspect.getsource(inspect.getmodule(attention_class))
    except (OSError, TypeError):
        return True
    return not ("create_bidirectional_mask" in source and "create_causal_mask" not in source)


def _fused(module, query, key, value, attention_mask, dropout, scaling, is_causal, position_bias) -> Tensor:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
        position_bias=position_bias,
    )
    return output


def attnlab_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    softcap: Optional[float] = None,
    position_bias: Optional[Tensor] = None,
    s_aux: Optional[Tensor] = None,
    sinks: Optional[Tensor] = None,
    **kwargs: Any,
) -> tuple[Tensor, Optional[Tensor]]:
    """transformers' attention signature; see the module docstring.

    The module's route (set by :func:`attnlab.hf.attach`) says whether its weights are
    kept, reduced to statistics, its heads masked or patched. A module with no route
    (the model left on ``attn_implementation="attnlab"`` outside any ``attach``) gives its
    weights when the call asks for ``output_attentions``, as ``eager`` would.
    """
    # attnlab's own inspection tools (capture_attention, mask_heads, the explain methods)
    # reach a served module through these keywords, as they reach attnlab's modules.
    need_weights = kwargs.pop("need_weights", None)
    head_mask = kwargs.pop("head_mask", None)
    if kwargs.pop("average_attn_weights", False):
        raise UnsupportedAttention(f"{type(module).__name__}: attnlab's backend gives per-head weights only")
    _unsupported_keywords(module, kwargs)
    if sinks is not None:  # the same virtual key under another name (per query row where it is [B, H, T, 1])
        if s_aux is not None:
            raise UnsupportedAttention(f"{type(module).__name__} passed both s_aux and sinks to its attention "
                                       f"function; attnlab's backend takes one")
        s_aux = sinks
    scale = head_scale_of(module)  # heads switched off by mask_heads (attach(head_mask=) included)
    if scale is not None:
        head_mask = scale if head_mask is None else head_mask * scale
    route = route_of(module)
    asked = bool(kwargs.get("output_attentions")) or bool(need_weights)
    if route is not None:
        route.count_call()
        asked = asked or route.session.output_attentions_asked
    exact = route.exact(asked) if route is not None else asked
    T = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", None)
        if is_causal is None:
            is_causal = _builds_causal_masks(type(module))
    causal = bool(T > 1 and attention_mask is None and is_causal)
    if not exact and softcap is None and s_aux is None:
        output = _fused(module, query, key, value, attention_mask, dropout, scaling, is_causal, position_bias)
        weights = None
    else:
        if causal and key.shape[2] > T:  # an empty static cache behind the prompt: sdpa's crop
            key, value = key[:, :, :T], value[:, :, :T]
            position_bias = None if position_bias is None else position_bias[..., :T]
        output, weights = exact_attention(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, causal=causal,
            softcap=softcap, position_bias=position_bias, sinks=s_aux,
            rows_per_block=route.rows_per_block(query, key) if route is not None and exact else None,
            keep_weights=exact and (route is None or not route.session.statistics_mode),
            on_block=_masked_blocks(route.statistics_block, head_mask)
            if route is not None and route.session.statistics_mode else None,
        )
    if head_mask is not None:  # as eager's head_mask and attnlab's own modules: on the weights too
        output = output * head_mask.to(output.dtype)[:, None]  # [H, 1] on [B, T, H, D]
        if weights is not None:
            weights = weights * head_mask.to(weights.dtype)[:, None, None]  # [H, 1, 1] on [B, H, T, S]
    if route is not None:
        output = route.edit_output(output)
        weights = route.returned_weights(weights, asked)
    return output, weights


def _masked_blocks(on_block: Any, head_mask: Optional[Tensor]) -> Any:
    """``on_block`` given each block of weights times the head mask (a switched-off head's
    weights are zero, as the weights returned are)."""
    if head_mask is None:
        return on_block

    def masked(weights: Tensor, *args: Any) -> None:
        on_block(weights * head_mask.to(weights.dtype)[:, None, None], *args)

    return masked


# Configs of models transformers' sdpa does not serve: they get eager's masks (below).
_EAGER_MASKS: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def use_eager_masks(model: nn.Module, configs: list) -> None:
    """Give ``configs`` eager's masks when ``model`` is one transformers' sdpa does not serve:
    such a model may rely on masks sdpa's builder leaves out (NLLB-MoE's decoder attention says
    ``is_causal=False``) or extend them with additive terms (DeepSeek-V4's compressed keys)."""
    if not getattr(model, "_supports_sdpa", True):
        for config in configs:
            _EAGER_MASKS[id(config)] = config


def attnlab_mask(*args: Any, config: Any = None, **kwargs: Any) -> Any:
    """``sdpa``'s mask builder; eager's for the configs :func:`use_eager_masks` marked."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    if config is not None and _EAGER_MASKS.get(id(config)) is config:
        kwargs.pop("allow_is_causal_skip", None)
        return eager_mask(*args, config=config, **kwargs)
    return sdpa_mask(*args, config=config, **kwargs)


def register() -> None:
    """Register the function and its mask builder with transformers (idempotent).

    The mask builder is ``sdpa``'s: boolean masks, and no mask where ``is_causal`` says
    it all, so the fused path receives exactly what ``sdpa`` receives (but for models sdpa
    does not serve: :func:`use_eager_masks`).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(BACKEND_NAME, attnlab_attention_forward)
    AttentionMaskInterface.register(BACKEND_NAME, attnlab_mask)
