"""The one inspection function both doors run: recording, statistics and head interventions.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key-value heads, ``T`` query
length, ``S`` key length, ``D`` head dim.

attnlab's own attention modules call the function their ``attn_implementation`` names
(:mod:`attnlab.attention.interface`); a transformers model's modules call the one its
config names (``transformers.AttentionInterface``). Inside an inspection block both are
pointed at attnlab's function, which adapts the call and runs :func:`inspected_attention`:

* a module whose weights nobody asked for runs the fused kernel it would run anyway;
* a chosen module computes its exact weights (:func:`~attnlab.attention.exact.exact_attention`)
  and keeps them, or reduces them block by block of query rows to statistics;
* every module multiplies its heads by the head mask (:func:`~attnlab.attention.interface.set_head_scale`)
  and records or replaces each head's output ``[B, T, H, D]`` before the output projection.

Which module does what is kept in one table, module -> :class:`Route`, filled when a
block starts and emptied in ``finally``: the functions have fixed signatures, so they
look their instructions up there (nothing is stored on the modules).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention.exact import exact_attention
from ..._precision import bf16_is_emulated
from ...attention.functional import AttentionResult
from ...attention.interface import (
    ATTENTION_FUNCTIONS,
    combined_head_mask,
    grouped_attention,
    use_attention_function,
)
from ...attention.masks import head_mask_scale, validate_attention_bias, validate_attention_mask
from ...outputs import LayerAttentions
from .query_rows import RowChoice, check_rows, resolve_rows, row_attention
from .site_statistics import SiteStatistics

__all__ = ["INSPECTING", "Route", "Session", "UnsupportedAttention", "inspected_attention", "route_of", "routed",
           "select_layers"]

# The name attnlab's own modules find the inspecting function under while a block runs
# (transformers models find theirs under the same name in AttentionInterface).
INSPECTING = "attnlab"

# The most attention weights one block of query rows holds in statistics mode.
_STATISTICS_BLOCK_CELLS = 1 << 22

_ROUTES: "weakref.WeakKeyDictionary[nn.Module, Route]" = weakref.WeakKeyDictionary()


class UnsupportedAttention(ValueError):
    """An attention call attnlab cannot compute exactly (named module and keyword)."""


def route_of(module: nn.Module) -> Optional["Route"]:
    """The route of ``module`` inside an active inspection block, else ``None``."""
    return _ROUTES.get(module)


class Route:
    """What one attention module does inside an inspection block."""

    def __init__(self, session: "Session", site: Any, chosen: bool) -> None:
        self.session, self.site, self.chosen = session, site, chosen
        self.patch: Optional[tuple[Tensor, Tensor]] = None  # ([H] bool heads, [B, T, H, D] values)
        self.record_output = False
        self.chunks, self.offset = 0, 0  # calls and query rows so far in this run of the module

    def enter(self, module: nn.Module, args: tuple) -> None:
        """The module's forward begins. Refuse a module run twice in one forward: its layers
        cannot be told apart (ALBERT's shared layer)."""
        calls = self.session._calls
        if self.site.module in calls and self.session.refuse_shared_modules:
            raise UnsupportedAttention(
                f"{type(self.site.module).__name__} at {self.site.path} runs more than once in one forward "
                f"(layers sharing one attention module, as ALBERT's); attnlab tells layers apart by module "
                f"and cannot serve this model" + (" (attnlab.load opens ALBERT with a module per layer)"
                                                  if "albert" in type(self.site.module).__name__.lower() else "")
            )
        calls.add(self.site.module)
        self.chunks, self.offset = 0, 0

    def count_call(self) -> None:
        """One call of the attention function. Several in one run of the module's forward are
        chunks of one sequence, each attending within itself (Qwen2-VL's vision tower attends to
        each image apart): their weights are laid block-diagonally, their outputs in order."""
        self.chunks += 1

    def exact(self, asked: bool) -> bool:
        if self.session.statistics_mode:
            return self.chosen
        return self.chosen or (asked and self.session.layers_asked is None)

    def rows_per_block(self, query: Tensor, key: Tensor) -> Optional[int]:
        if not self.session.statistics_mode:
            return None
        B, H, _, _ = query.shape
        return max(1, _STATISTICS_BLOCK_CELLS // max(1, B * H * key.shape[2]))

    def statistics_block(self, weights: Tensor, start: int, rows: int, keys: int) -> None:
        """The statistics mode's reduction of one block of query rows' weights."""
        if weights.shape[-1] < keys:  # a causal block that stops at its last row: the rest is zeros
            weights = F.pad(weights, (0, keys - weights.shape[-1]))
        self.session._update_statistics(self, weights, start, rows)

    def edit_output(self, output: Tensor) -> Tensor:
        """Head patches on ``[B, T, H, D]`` (each head's output before mixing)."""
        rows, offset = output.shape[1], self.offset
        self.offset += rows
        if self.record_output:
            kept = output.detach().clone()
            earlier = self.session.head_outputs.get(self.site.name)
            self.session.head_outputs[self.site.name] = (
                torch.cat([earlier, kept], dim=1) if self.chunks > 1 and earlier is not None else kept)
        if self.patch is not None:
            heads, values = self.patch
            if values.dim() == output.dim() and values.shape[1] > rows:  # a chunk: its rows of the source run
                values = values[:, offset: offset + rows]
            if values.shape != output.shape:
                raise ValueError(
                    f"{self.site.name}: the patched run's attention output is {tuple(output.shape)} but the "
                    f"source run's was {tuple(values.shape)}; patching needs inputs of one shape"
                )
            output = torch.where(heads.to(output.device)[:, None], values.to(output.dtype), output)
        return output

    def chose_rows(self, rows: list[int]) -> None:
        """This call keeps the weights of query rows ``rows`` only."""
        if self.chunks > 1:
            raise UnsupportedAttention(
                f"{self.site.name} attends in several chunks of one sequence (as an image tower attending "
                f"within each image); rows= cannot choose among them: leave rows out")
        self.session.query_rows[self.site.name] = torch.tensor(rows)

    def returned_weights(self, weights: Optional[Tensor], asked: bool) -> Optional[Tensor]:
        if weights is not None and (self.chosen or asked):
            kept = weights if self.session.heads is None or not self.chosen else weights[:, self.session.heads]
            kept = kept if self.session.grad else kept.detach()
            earlier = self.session._weights.get(self.site.name)
            if self.chunks > 1 and earlier is not None:
                kept = _block_diagonal(earlier, kept)
            self.session._record(self.site, kept)
        return weights if asked else None


def _block_diagonal(first: Tensor, second: Tensor) -> Tensor:
    """``[..., T1 + T2, S1 + S2]``: two chunks' weights, each over its own keys, zeros between."""
    T1, S1 = first.shape[-2:]
    T2, S2 = second.shape[-2:]
    joined = first.new_zeros(*first.shape[:-2], T1 + T2, S1 + S2)
    joined[..., :T1, :S1] = first
    joined[..., T1:, S1:] = second
    return joined


def select_layers(sites: Sequence[Any], layers: Any) -> Optional[set[str]]:
    """Names chosen by ``layers``: ``None`` (only when output_attentions asks), ``"all"``,
    ints (layer numbers counted from 1, in every stack) or names."""
    if layers is None:
        return None
    names = [site.name for site in sites]
    if isinstance(layers, str):
        if layers == "all":
            return set(names)
        layers = [layers]
    chosen = set()
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, str)):
            raise TypeError(f"layers holds {layer!r}: give layer numbers counted from 1, names or 'all'")
        if isinstance(layer, int):
            matches = [name for name in names if name.rsplit("layer_", 1)[-1] == str(layer)]
        else:
            matches = [layer] if layer in names else []
        if not matches:
            raise ValueError(f"layers: no attention layer {layer!r}; this model has {', '.join(names)}")
        chosen.update(matches)
    return chosen


class Session:
    """What an inspection block yields: the weights (or statistics) of the latest forward.

    A module run more than once in one forward is refused (``refuse_shared_modules``,
    transformers models: ALBERT shares one layer) or keeps its latest call (attnlab's own
    models, whose modules may be called outside the model's own forward, as in generation).

    ``rows`` keeps the exact weights of chosen query rows only (:func:`check_rows`): the
    module's output comes from its fused kernel, and the chosen rows' weights over every key
    are computed beside it, so no ``[T, S]`` map is ever made.

    Attributes:
        sites: every attention site, named (``layer_1``, ``cross.layer_1``, ...).
        attentions: the chosen self-attention layers' weights of the latest call of each
            module, ``[B, H, T, S]`` (``H`` = the chosen heads; ``[B, H, R, S]`` for ``R``
            chosen rows, whose positions are in ``query_rows``), as a
            :class:`~attnlab.outputs.LayerAttentions` keyed by layer name.
        cross_attentions: the same for cross-attention layers.
        head_outputs: each recorded layer's head outputs ``[B, T, H, D]``.
        recorder: the statistics mode's :class:`SiteStatistics`.
    """

    def __init__(self, model: nn.Module, sites: list, layers: Optional[set[str]], heads: Optional[list[int]],
                 grad: bool, statistics: bool, statistics_options: dict, *,
                 refuse_shared_modules: bool = True, rows: RowChoice = None) -> None:
        if rows is not None and statistics:
            raise ValueError("rows= chooses query rows whose weights are kept; statistics are computed over "
                             "every row: ask for one or the other")
        self.model, self.sites = model, sites
        self.rows = check_rows(rows)
        self.query_rows: dict[str, Tensor] = {}  # each layer's rows behind its kept weights
        self.layers_asked, self.heads, self.grad = layers, heads, grad
        self.statistics_mode = statistics
        self._weights: dict[str, Tensor] = {}
        self.head_outputs: dict[str, Tensor] = {}
        self.recorder = SiteStatistics(heads=heads, **statistics_options)
        self._padding: dict[str, Optional[Tensor]] = {}
        self._calls: set[nn.Module] = set()  # modules called in the current forward
        self.output_attentions_asked = False  # what the model's own call asked
        self.refuse_shared_modules = refuse_shared_modules

    # -- what the forward left -------------------------------------------------------
    def _record(self, site: Any, weights: Tensor) -> None:
        if getattr(self.model, "hf_device_map", None) and weights.device.type != "cpu":
            weights = weights.to("cpu")  # a model spread over devices (a device map): every layer's maps in one place
        self._weights[site.name] = weights

    def _layer_attentions(self, cross: bool) -> LayerAttentions:
        names = [site.name for site in self.sites if site.cross == cross and site.name in self._weights]
        return LayerAttentions([self._weights[name] for name in names], names=names)

    @property
    def attentions(self) -> LayerAttentions:
        return self._layer_attentions(cross=False)

    @property
    def cross_attentions(self) -> LayerAttentions:
        return self._layer_attentions(cross=True)

    def clear(self) -> None:
        """Forget recorded weights and statistics (the block stays open)."""
        self._weights, self.head_outputs = {}, {}
        self.query_rows.clear()
        self.recorder.clear()

    # -- each forward -----------------------------------------------------------------
    def _new_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A (sub)model's forward begins: a new pass through its attention modules."""
        self._calls = set()

    def _remember_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's own call: its padding and token ids (for the statistics)."""
        self._new_forward(module, args, kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask", kwargs.get("mask"))
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor):
            mask = args[1]
        self._padding = {
            "attention_mask": mask if isinstance(mask, Tensor) and mask.dim() == 2 else None,
            "input_ids": ids if isinstance(ids, Tensor) and ids.dim() == 2 else None,
        }

    def _masks_for(self, site: Any, B: int, T: int, S: int, device) -> tuple[Tensor, Tensor]:
        """``query_mask [B, T]`` and ``key_mask [B, S]`` (``True`` on real tokens) of a call:
        the model's padding mask, its last positions for the queries, on self-attention."""
        mask = None if site.cross else self._padding.get("attention_mask")
        fits = mask is not None and mask.shape[0] == B
        ones = torch.ones(B, max(T, S), dtype=torch.bool, device=device)
        queries = mask[:, mask.shape[1] - T:] if fits and mask.shape[1] >= T else ones[:, :T]
        keys = mask if fits and mask.shape[1] == S else ones[:, :S]
        return queries.to(device=device, dtype=torch.bool), keys.to(device=device, dtype=torch.bool)

    def _causal(self, site: Any) -> bool:
        causal = getattr(site, "causal", None)
        if causal is None:
            causal = bool(getattr(site.module, "is_causal", False)) and not site.cross
        return bool(causal)

    def _update_statistics(self, route: Route, weights: Tensor, start: int, T: int) -> None:
        """Add one block of rows ``start .. start + t`` of a call with ``T`` query rows."""
        site = route.site
        B, H, t, S = weights.shape
        query_mask, key_mask = self._masks_for(site, B, T, S, weights.device)
        ids = self._padding.get("input_ids")
        ids = ids.to(weights.device) if ids is not None and ids.shape == (B, S) and not site.cross else None
        self.recorder.add(site.name, weights, query_mask[:, start:start + t], key_mask, input_ids=ids, start=start,
                          rows=T, causal=self._causal(site))

    def row_counts(self) -> dict[str, list[int]]:
        """``{layer: [query rows counted per head]}`` behind :meth:`statistics`."""
        return self.recorder.row_counts()

    def statistics(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{layer: {statistic: [one value per head]}}`` over every forward since the block
        began (:meth:`~attnlab.inspect.compute.site_statistics.SiteStatistics.means`)."""
        return self.recorder.means()

    def module_of(self, name: str) -> nn.Module:
        """The attention module named ``name`` (``layer_2``, ``cross.layer_1``, ...)."""
        for site in self.sites:
            if site.name == name:
                return site.module
        raise ValueError(f"no attention layer {name!r}; this model has {', '.join(s.name for s in self.sites)}")

    def watch_head_outputs(self, layers: Sequence[str],
                           replace: Optional[Mapping[str, tuple[Tensor, Tensor]]] = None) -> dict[str, Tensor]:
        """Record each head's output ``[B, T, H, D]`` of ``layers`` in every forward of the
        block (in :attr:`head_outputs`, returned), and replace the chosen heads' outputs of
        the layers ``replace`` names (``{layer: ([H] bool heads, [B, T, H, D] values)}``)."""
        replace = dict(replace or {})
        for layer in dict.fromkeys([*layers, *replace]):
            route = _ROUTES[self.module_of(layer)]
            route.record_output = True
            if layer in replace:
                chosen, values = replace[layer]
                if route.site.heads is not None and chosen.shape != (route.site.heads,):
                    raise ValueError(f"{layer} has {route.site.heads} heads; got a choice of {chosen.shape[0]}")
                route.patch = (chosen, values)
        return self.head_outputs

    def __repr__(self) -> str:
        chosen = "as output_attentions asks" if self.layers_asked is None else sorted(self.layers_asked)
        return f"{type(self).__name__}({len(self.sites)} attention layers; exact weights: {chosen})"


@contextlib.contextmanager
def routed(session: Session) -> Iterator[Session]:
    """Give each of ``session``'s sites its route inside the block (chosen: the layers the
    session asks for); the model's own call starts a pass and says its padding."""
    busy = [site.path for site in session.sites if site.module in _ROUTES]
    if busy:
        raise RuntimeError(f"{type(session.model).__name__} is already being inspected (at {busy[0]}); "
                           f"one inspection block at a time")
    chosen = session.layers_asked
    handles = []
    try:
        for site in session.sites:
            route = _ROUTES[site.module] = Route(session, site, chosen is not None and site.name in chosen)
            handles.append(site.module.register_forward_pre_hook(route.enter))
        handles.append(session.model.register_forward_pre_hook(session._remember_call, with_kwargs=True))
        yield session
    finally:
        for handle in handles:
            handle.remove()
        for site in session.sites:
            _ROUTES.pop(site.module, None)


def inspected_attention(
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
    head_mask: Optional[Tensor] = None,
    asked: bool = False,
    fused: Optional[Callable[[], Tensor]] = None,
    reference: Optional[Callable[[], tuple[Tensor, Tensor]]] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Attention as the module's route says, for both doors.

    Args:
        attention_mask: bool (``True`` = may attend) or additive float, ``[B|1, 1|H, T|1, S]``.
        causal: a causal constraint besides the mask (top-left, as ``is_causal`` in torch).
        head_mask: ``[H]`` or ``[B, H]`` multipliers the call passed (those set from outside,
            :func:`~attnlab.attention.interface.set_head_scale`, are read here too).
        asked: whether the call asked for its weights.
        fused: the module's fused kernel, giving ``[B, T, H, D]``: run where no weights are
            wanted (``None``: the exact path always).
        reference: the module's own path with weights, giving ``(output [B, T, H, D],
            weights)``: run where weights are kept whole, so that they equal what the module
            returns when asked for them (``None``: :func:`exact_attention`, which also
            serves the statistics mode, block by block).

    Returns:
        ``(output [B, T, H, D], weights [B, H, T, S] or None)``.
    """
    head_mask = combined_head_mask(module, head_mask)
    route = route_of(module)
    if route is not None:
        route.count_call()
        asked = asked or route.session.output_attentions_asked
    exact = route.exact(asked) if route is not None else asked
    T = query.shape[2]
    scale = None if head_mask is None else head_mask_scale(head_mask, query.shape[1], query.shape[0])  # [B|1, H, 1, 1]
    statistics = route is not None and route.session.statistics_mode
    rows = resolve_rows(route.session.rows, T) if exact and route is not None and not statistics else None
    if not exact and softcap is None and sinks is None and fused is not None:
        output, weights = fused(), None
    elif exact and not statistics and reference is not None and rows is None:
        output, weights = reference()
    else:
        if causal and attention_mask is None and key.shape[2] > T:  # keys past the last query row: never attended
            key, value = key[:, :, :T], value[:, :, :T]
            position_bias = None if position_bias is None else position_bias[..., :T]
        dtype = query.dtype
        if (statistics or rows is not None) and bf16_is_emulated(query):
            # no bfloat16 products on this CPU (emulated, ~30x slower than float32's): the
            # weights that are reduced or chosen are computed in float32, as attnlab's own
            # modules attend there
            query, key, value, position_bias, sinks = (
                None if tensor is None else tensor.float() for tensor in (query, key, value, position_bias, sinks))
        if rows is not None:
            output, weights = row_attention(
                module, query, key, value, attention_mask, rows, block_cells=_STATISTICS_BLOCK_CELLS,
                scaling=scaling, dropout=dropout, causal=causal, softcap=softcap, position_bias=position_bias,
                sinks=sinks, fused=fused)
            output, weights = output.to(dtype), weights.to(dtype)
        else:
            on_block = None
            if statistics:
                on_block = route.statistics_block if scale is None else (
                    lambda weights, *rest: route.statistics_block(weights * scale.to(weights.dtype), *rest))
            output, weights = exact_attention(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, causal=causal,
                softcap=softcap, position_bias=position_bias, sinks=sinks,
                rows_per_block=route.rows_per_block(query, key) if route is not None and exact else None,
                keep_weights=exact and not statistics, on_block=on_block,
            )
            output = output.to(dtype)
    if scale is not None:  # each head's weights and output (a switched-off head's weights are zero)
        output = output * scale.transpose(1, 2).to(output.dtype)  # [B|1, 1, H, 1] on [B, T, H, D]
        if weights is not None:
            weights = weights * scale.to(weights.dtype)
    if route is not None:
        output = route.edit_output(output)
        if rows is not None:
            route.chose_rows(rows)
        weights = route.returned_weights(weights, asked)
    return output, weights


def inspecting_attention_function(
    module: nn.Module,
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
    head_mask: Optional[Tensor] = None,
) -> AttentionResult:
    """attnlab's interface (:mod:`attnlab.attention.interface`) to :func:`inspected_attention`:
    the function attnlab's own modules call inside an inspection block."""
    if bf16_is_emulated(query):  # as attention() does: no native bfloat16 here, attend in float32
        with torch.autocast("cpu", enabled=False):
            output, weights = inspecting_attention_function(
                module, query.float(), key.float(), value.float(), mask,
                attn_bias=None if attn_bias is None else attn_bias.float(), dropout=dropout, is_causal=is_causal,
                scale=scale, need_weights=need_weights, head_mask=head_mask)
        return AttentionResult(output.to(query.dtype), None if weights is None else weights.to(query.dtype))
    B, H, T, _ = query.shape
    S = key.shape[2]
    sizes = {"batch": B, "heads": H, "query_len": T, "key_len": S}
    keep = validate_attention_mask(mask, **sizes, name="mask")
    bias = validate_attention_bias(attn_bias, **sizes, dtype=query.dtype)

    def own_path(need_weights: bool) -> Callable[[], Any]:
        def run() -> Any:
            output, weights = grouped_attention(query, key, value, mask, attn_bias=attn_bias, dropout=dropout,
                                                is_causal=is_causal, scale=scale, need_weights=need_weights)
            output = output.transpose(1, 2)  # [B, T, H, D]
            return (output, weights) if need_weights else output

        return run

    output, weights = inspected_attention(
        module, query, key, value, keep, scaling=scale, dropout=dropout, causal=is_causal, position_bias=bias,
        head_mask=head_mask, asked=need_weights, fused=own_path(False), reference=own_path(True))
    return AttentionResult(output.transpose(1, 2), weights)  # [B, H, T, D]


ATTENTION_FUNCTIONS.register(INSPECTING, inspecting_attention_function)


@contextlib.contextmanager
def inspecting(session: Session) -> Iterator[Session]:
    """attnlab's own modules of ``session``'s sites call the inspecting function, routed, inside the block."""
    with use_attention_function(session.model, INSPECTING, modules=[site.module for site in session.sites]), \
            routed(session):
        yield session
