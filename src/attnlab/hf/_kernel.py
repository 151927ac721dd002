"""The attention function attnlab registers with transformers.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key-value heads, ``T`` query
length, ``S`` key length, ``D`` head dim.

Every attention module of a transformers model (5.x) calls one function from
``ALL_ATTENTION_FUNCTIONS`` with ``(module, query, key, value, attention_mask, dropout=,
scaling=, **kwargs)``: ``query`` ``[B, H, T, D]``, ``key`` / ``value`` ``[B, K, S, D]``,
returning ``(output [B, T, H, D], weights [B, H, T, S] or None)``. attnlab's function
adapts the call (the keywords it reads, causality, attention sinks) and runs the
inspecting function attnlab's own modules run too
(:func:`~attnlab.inspect.compute.routing.inspected_attention`), on two paths:

* **fused**: transformers' own ``sdpa`` function, so that a layer nobody looks at gives
  exactly what ``attn_implementation="sdpa"`` gives;
* **exact** (:func:`~attnlab.attention.exact.exact_attention`):
  ``softmax(Q K^T * scaling [softcap] + position_bias + mask [, sinks]) V``
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
import weakref
from typing import Any, Optional

from torch import Tensor, nn

from ..attention.exact import exact_attention
from ..attention.interface import input_rule_of
from ..inspect.compute.routing import UnsupportedAttention, inspected_attention

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


def _unsupported_keywords(module: nn.Module, kwargs: dict[str, Any]) -> None:
    unknown = sorted(name for name, value in kwargs.items() if name not in _IGNORED and value is not None)
    if unknown:
        raise UnsupportedAttention(
            f"{type(module).__name__} passed {', '.join(repr(name) for name in unknown)} to its attention "
            f"function, which attnlab's backend does not implement; run this model with "
            f"attn_implementation='eager' instead"
        )


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
    rule = input_rule_of(module)  # before both paths see them (AttnLRP's gradient shares)
    if rule is not None:
        query, key, value = rule(query, key, value)
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
    T = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", None)
        if is_causal is None:
            is_causal = _builds_causal_masks(type(module))
    causal = bool(T > 1 and attention_mask is None and is_causal)
    return inspected_attention(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, causal=causal,
        softcap=softcap, position_bias=position_bias, sinks=s_aux, head_mask=head_mask,
        asked=bool(kwargs.get("output_attentions")) or bool(need_weights),
        fused=lambda: _fused(module, query, key, value, attention_mask, dropout, scaling, is_causal, position_bias),
    )


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
