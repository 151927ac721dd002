"""The attention functions attnlab's modules call, looked up by name.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key/value heads, ``T`` query
length, ``S`` key length, ``D`` head dim.

As transformers' ``AttentionInterface``: every attention module of attnlab projects its
queries, keys and values, then calls the function its ``attn_implementation`` names
(``"sdpa"`` unless something switched it) with one signature::

    function(module, query [B, H, T, D], key [B, K, S, D], value [B, K, S, Dv], mask,
             *, attn_bias=None, dropout=0.0, is_causal=False, scale=None,
             need_weights=False, head_mask=None) -> (output [B, H, T, Dv], weights | None)

``mask`` is a keep mask and ``attn_bias`` an additive term, as :mod:`attnlab.attention.masks`
reads them; ``K`` divides ``H`` (grouped-query heads, each key/value head serving ``H / K``
consecutive query heads); ``head_mask`` ``[H]`` or ``[B, H]`` multiplies each head's
weights and output. The inspection tools register a function of their own and point the
modules they look at to it for the length of a block, so recording, statistics and
head interventions live in one function, the one transformers models are served by too.

Head multipliers set from outside (:func:`set_head_scale`) are read by every attention
function of attnlab, here and in the transformers backend: not every module passes a
keyword on, but every module passes itself. So is an input rule (:func:`set_input_rule`):
a function of ``(query, key, value)`` applied before any attention function runs (AttnLRP
changes their gradients there without changing their values).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

from torch import Tensor, nn

from .functional import AttentionResult, attention
from .masks import head_mask_scale

__all__ = [
    "ATTENTION_FUNCTIONS",
    "AttentionFunctions",
    "attend",
    "calls_attention_function",
    "grouped_attention",
    "head_scale_of",
    "input_rule_of",
    "names_attention_function",
    "repeat_kv",
    "sdpa_attention_function",
    "set_head_scale",
    "set_input_rule",
    "use_attention_function",
]

AttentionFunction = Callable[..., AttentionResult]
InputRule = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


class AttentionFunctions:
    """The registry of attention functions by name (``"sdpa"`` is built in).

    Example:
        >>> def traced(module, query, key, value, mask=None, **options):
        ...     print(type(module).__name__, tuple(query.shape))
        ...     return sdpa_attention_function(module, query, key, value, mask, **options)
        >>> ATTENTION_FUNCTIONS.register("traced", traced)
        >>> with use_attention_function(model, "traced"):
        ...     model(ids)
    """

    def __init__(self) -> None:
        self._functions: dict[str, AttentionFunction] = {}

    def register(self, name: str, function: AttentionFunction) -> None:
        """Make ``function`` available under ``name`` (replacing one of that name)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"an attention function needs a non-empty name, got {name!r}")
        if not callable(function):
            raise TypeError(f"attention function {name!r} must be callable, got {type(function).__name__}")
        self._functions[name] = function

    def __getitem__(self, name: str) -> AttentionFunction:
        try:
            return self._functions[name]
        except KeyError:
            raise ValueError(
                f"no attention function {name!r}; registered: {', '.join(sorted(self._functions))} "
                f"(register one with ATTENTION_FUNCTIONS.register)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def names(self) -> list[str]:
        return sorted(self._functions)


ATTENTION_FUNCTIONS = AttentionFunctions()

# module -> [H] multipliers of its heads, set for a while from outside the module
_HEAD_SCALES: "weakref.WeakKeyDictionary[nn.Module, Tensor]" = weakref.WeakKeyDictionary()

# module -> a function of (query, key, value) applied before attending, set for a while from outside
_INPUT_RULES: "weakref.WeakKeyDictionary[nn.Module, InputRule]" = weakref.WeakKeyDictionary()

# Modules of other libraries that attnlab's attention function serves for a while
# (module -> number of heads), filled and emptied by the code that routes them.
_SERVED: "weakref.WeakKeyDictionary[nn.Module, Optional[int]]" = weakref.WeakKeyDictionary()


def set_head_scale(module: nn.Module, scale: Optional[Tensor]) -> None:
    """Multiply ``module``'s heads by ``scale`` ``[H]`` in every call (``None``: no longer)."""
    if scale is None:
        _HEAD_SCALES.pop(module, None)
    else:
        _HEAD_SCALES[module] = scale


def head_scale_of(module: nn.Module) -> Optional[Tensor]:
    """The ``[H]`` multipliers :func:`set_head_scale` set for ``module``, else ``None``."""
    return _HEAD_SCALES.get(module)


def set_input_rule(module: nn.Module, rule: Optional[InputRule]) -> None:
    """Pass ``module``'s ``(query, key, value)`` through ``rule`` before every attention call,
    whichever function serves it (``None``: no longer)."""
    if rule is None:
        _INPUT_RULES.pop(module, None)
    else:
        _INPUT_RULES[module] = rule


def input_rule_of(module: nn.Module) -> Optional[InputRule]:
    """The rule :func:`set_input_rule` set for ``module``, else ``None``."""
    return _INPUT_RULES.get(module)


def serve_as_attention(modules: dict[nn.Module, Optional[int]], serve: bool = True) -> None:
    """Count ``modules`` (module -> its number of heads) as modules that call attnlab's
    attention functions, or no longer (``serve=False``): they take ``need_weights`` and
    ``head_mask`` and return ``(output, weights)``. Held by weak reference."""
    for module, heads in modules.items():
        if serve:
            _SERVED[module] = heads
        else:
            _SERVED.pop(module, None)


def is_served(module: nn.Module) -> bool:
    """Whether :func:`serve_as_attention` counts ``module`` now."""
    return module in _SERVED


def served_heads(module: nn.Module) -> Optional[int]:
    """The number of heads a served module was registered with."""
    return _SERVED.get(module)


def names_attention_function(module: nn.Module) -> bool:
    """Whether ``module`` is one of attnlab's attention modules: it carries the name of the
    function it calls (``attn_implementation``), which :func:`use_attention_function` switches."""
    return isinstance(getattr(module, "attn_implementation", None), str)


def calls_attention_function(module: nn.Module) -> bool:
    """Whether ``module`` calls one of attnlab's attention functions: attnlab's own attention
    modules (:func:`names_attention_function`) and the modules of other libraries served now."""
    return names_attention_function(module) or module in _SERVED


def combined_head_mask(module: nn.Module, head_mask: Optional[Tensor]) -> Optional[Tensor]:
    """``head_mask`` (``[H]`` or ``[B, H]``) times the multipliers set for ``module``."""
    scale = _HEAD_SCALES.get(module)
    if scale is None:
        return head_mask
    return scale if head_mask is None else head_mask * scale


def scale_heads(output: Tensor, weights: Optional[Tensor], head_mask: Optional[Tensor]) -> AttentionResult:
    """``output`` ``[B, H, T, Dv]`` and ``weights`` ``[B, H, T, S]`` times each head's entry of
    ``head_mask`` (``[H]`` or ``[B, H]``); as they are without one."""
    if head_mask is not None:
        scale = head_mask_scale(head_mask, output.shape[1], output.shape[0]).to(output.dtype)  # [B|1, H, 1, 1]
        output = output * scale
        if weights is not None:
            weights = weights * scale.to(weights.dtype)
    return AttentionResult(output, weights)


def repeat_kv(states: Tensor, heads: int) -> Tensor:
    """``[B, K, S, D]`` key or value heads as ``[B, H, S, D]``: each serves ``H / K``
    consecutive query heads, as transformers' ``repeat_kv`` lays them out."""
    B, K, S, D = states.shape
    if K == heads:
        return states
    return states[:, :, None].expand(B, K, heads // K, S, D).reshape(B, heads, S, D)


def grouped_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Optional[Tensor] = None,
    *,
    attn_bias: Optional[Tensor] = None,
    dropout: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    need_weights: bool = False,
) -> AttentionResult:
    """:func:`~attnlab.attention.functional.attention` (the fused kernel unless weights are
    asked) on ``K`` key/value heads serving ``H`` query heads; where one query row attends,
    without copying the keys."""
    options = {"scale": scale, "need_weights": need_weights}
    grouped = (isinstance(query, Tensor) and isinstance(key, Tensor) and isinstance(value, Tensor)
               and query.dim() == key.dim() == value.dim() == 4 and 0 < key.shape[1] != query.shape[1]
               and query.shape[1] % key.shape[1] == 0)  # else attention() checks and refuses the shapes
    if grouped and query.shape[2] == 1 and not is_causal and attn_bias is None and dropout == 0.0:
        # One new token: the H / K query heads of a group become H / K query rows of their
        # key/value head, so a cache is read as it is, never copied per head.
        B, H, _, D = query.shape
        K = key.shape[1]
        output, weights = attention(query.reshape(B, K, H // K, D), key, value, mask, **options)
        output = output.reshape(B, H, 1, -1)  # [B, H, 1, Dv]
        weights = None if weights is None else weights.reshape(B, H, 1, -1)  # [B, H, 1, S]
        return AttentionResult(output, weights)
    if grouped:  # each key/value head serves H / K consecutive query heads (transformers' repeat_kv)
        key, value = repeat_kv(key, query.shape[1]), repeat_kv(value, query.shape[1])
    return attention(query, key, value, mask, attn_bias=attn_bias, dropout_p=dropout, is_causal=is_causal, **options)


def sdpa_attention_function(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            mask: Optional[Tensor] = None, *, head_mask: Optional[Tensor] = None,
                            **options: Any) -> AttentionResult:
    """The built-in function, ``"sdpa"``: :func:`grouped_attention` (``options``: ``attn_bias``,
    ``dropout``, ``is_causal``, ``scale``, ``need_weights``), then the head mask."""
    output, weights = grouped_attention(query, key, value, mask, **options)
    return scale_heads(output, weights, combined_head_mask(module, head_mask))


ATTENTION_FUNCTIONS.register("sdpa", sdpa_attention_function)


def attend(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor] = None,
           **options) -> AttentionResult:
    """Call the attention function ``module.attn_implementation`` names (``"sdpa"`` by default),
    on the inputs after ``module``'s input rule (:func:`set_input_rule`) where it has one."""
    rule = _INPUT_RULES.get(module)
    if rule is not None:
        query, key, value = rule(query, key, value)
    name = getattr(module, "attn_implementation", "sdpa")
    return ATTENTION_FUNCTIONS[name](module, query, key, value, mask, **options)


@contextlib.contextmanager
def use_attention_function(model: nn.Module, name: str, *,
                           modules: Optional[Iterable[nn.Module]] = None) -> Iterator[list[nn.Module]]:
    """Every attnlab attention module of ``model`` (or just ``modules``) calls the function
    ``name`` inside the block; each gets its own back after. Yields the modules switched."""
    ATTENTION_FUNCTIONS[name]  # refuses an unknown name before anything changes
    chosen = list(model.modules()) if modules is None else list(modules)
    switched = [module for module in chosen if names_attention_function(module)]
    previous = [(module, module.__dict__.get("attn_implementation")) for module in switched]
    try:
        for module in switched:
            module.attn_implementation = name
        yield switched
    finally:
        for module, own in previous:
            if own is None:
                module.__dict__.pop("attn_implementation", None)
            else:
                module.attn_implementation = own
