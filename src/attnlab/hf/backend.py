"""attnlab as transformers' attention backend: :func:`attach`.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``D`` head dim, ``L`` attention modules.

Inside ``with attach(model, layers=[...]) as seen:`` every attention module of a
transformers model runs attnlab's attention function (registered once with
``transformers.AttentionInterface`` under the name ``"attnlab"``). The chosen layers
compute their exact per-head weights; every other layer runs the fused ``sdpa`` kernel.
When the block ends, each config gets back the implementation it had.

Which module does what is kept in one table, module -> route, filled when the block
starts and emptied in ``finally``: the attention function has transformers' fixed
signature, so it looks its instructions up there (nothing is stored on the modules).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..inspect.compute.capture import is_served, serve_as_attention
from ..inspect.compute.head_mask import mask_heads
from ..inspect.compute.site_statistics import SiteStatistics
from ..outputs import LayerAttentions
from ._kernel import BACKEND_NAME, UnsupportedAttention, use_eager_masks, register
from ._routes import _ROUTES, route_of
from ._sites import AttentionSite, attention_sites, unrouted_attention

__all__ = ["AttachedModel", "attach", "route_of"]


# The most attention weights one block of query rows holds in statistics mode.
_STATISTICS_BLOCK_CELLS = 1 << 22


class _Route:
    """What one attention module does inside an :func:`attach` block."""

    def __init__(self, session: "AttachedModel", site: AttentionSite, chosen: bool) -> None:
        self.session, self.site, self.chosen = session, site, chosen
        self.patch: Optional[tuple[Tensor, Tensor]] = None  # ([H] bool heads, [B, T, H, D] values)
        self.record_output = False
        self.chunks, self.offset = 0, 0  # calls and query rows so far in this run of the module

    def enter(self, module: nn.Module, args: tuple) -> None:
        """The module's forward begins. Refuse a module run twice in one forward: its layers
        cannot be told apart (ALBERT's shared layer)."""
        calls = self.session._calls
        if self.site.module in calls:
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
        """Head masks and patches on ``[B, T, H, D]`` (each head's output before mixing)."""
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


def _configs_of(model: nn.Module) -> list[Any]:
    """Every config object the model's modules read ``_attn_implementation`` from."""
    seen: dict[int, Any] = {}
    pending = [getattr(module, "config", None) for module in model.modules()]
    while pending:
        config = pending.pop()
        if config is None or id(config) in seen or not hasattr(config, "_attn_implementation_internal"):
            continue
        seen[id(config)] = config
        pending.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}) or {})
    return list(seen.values())


@contextlib.contextmanager
def implementation(model: nn.Module, name: str) -> Iterator[list[Any]]:
    """Every config of ``model`` reads attention implementation ``name`` inside the block (the
    sub-configs ``set_attn_implementation`` leaves alone too); each gets its own back after.
    Yields the configs."""
    configs = _configs_of(model)
    previous = [(config, config._attn_implementation_internal) for config in configs]
    try:
        model.set_attn_implementation(name)
        for config in configs:
            config._attn_implementation_internal = name
        yield configs
    finally:
        for config, own in previous:
            config._attn_implementation_internal = own


def _select_layers(sites: Sequence[AttentionSite], layers: Any) -> Optional[set[str]]:
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


class AttachedModel:
    """What :func:`attach` yields: the weights (or statistics) of the latest forward.

    Attributes:
        sites: every attention module, named (``layer_1``, ``cross.layer_1``, ...).
        attentions: the chosen self-attention layers' weights of the latest call of each
            module, ``[B, H, T, S]`` (``H`` = the chosen heads), as a
            :class:`~attnlab.outputs.LayerAttentions` keyed by layer name.
        cross_attentions: the same for cross-attention layers.
    """

    def __init__(self, model: nn.Module, sites: list[AttentionSite], layers: Optional[set[str]],
                 heads: Optional[list[int]], grad: bool, statistics: bool, statistics_options: dict) -> None:
        self.model, self.sites = model, sites
        self.layers_asked, self.heads, self.grad = layers, heads, grad
        self.statistics_mode = statistics
        self._weights: dict[str, Tensor] = {}
        self.head_outputs: dict[str, Tensor] = {}
        self.recorder = SiteStatistics(heads=heads, **statistics_options)
        self._head_masking = contextlib.ExitStack()  # mask_heads' hooks while a head mask is set
        self._padding: dict[str, Optional[Tensor]] = {}
        self._calls: set[nn.Module] = set()  # modules called in the current forward
        self.output_attentions_asked = False  # what the model's own call asked

    # -- what the forward left -------------------------------------------------------
    def _record(self, site: AttentionSite, weights: Tensor) -> None:
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
        """Forget recorded weights and statistics (the backend stays attached)."""
        self._weights, self.head_outputs = {}, {}
        self.recorder.clear()

    # -- each forward -----------------------------------------------------------------
    def _new_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A (sub)model's forward begins: a new pass through its attention modules."""
        self._calls = set()

    def _remember_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's own call: its padding (for the statistics) and whether it asked for
        ``output_attentions`` (some models keep that flag instead of passing it down)."""
        self._new_forward(module, args, kwargs)
        asked = kwargs.get("output_attentions")
        self.output_attentions_asked = bool(
            asked if asked is not None else getattr(getattr(module, "config", None), "output_attentions", False)
        )
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor):
            mask = args[1]
        ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], Tensor) else None)
        self._padding = {
            "attention_mask": mask if isinstance(mask, Tensor) and mask.dim() == 2 else None,
            "decoder_attention_mask": kwargs.get("decoder_attention_mask"),
            "input_ids": ids if isinstance(ids, Tensor) and ids.dim() == 2 else None,
        }

    def _masks_for(self, site: AttentionSite, B: int, T: int, S: int, device) -> tuple[Tensor, Tensor]:
        """``query_mask [B, T]`` and ``key_mask [B, S]`` (``True`` on real tokens) of a call."""
        encoder, decoder = self._padding.get("attention_mask"), self._padding.get("decoder_attention_mask")
        seq2seq = any(s.cross for s in self.sites) and any(s.name.startswith("decoder.") for s in self.sites)
        if site.cross:
            queries, keys = decoder, encoder
        elif seq2seq and site.name.startswith("decoder."):
            queries = keys = decoder
        else:
            queries = keys = encoder

        def fit(mask: Optional[Tensor], length: int) -> Tensor:
            if mask is None or mask.shape[0] != B or mask.shape[1] < length:
                return torch.ones(B, length, dtype=torch.bool, device=device)
            return mask[:, mask.shape[1] - length:].to(device=device, dtype=torch.bool)  # the last positions

        return fit(queries, T), fit(keys, S)

    def _update_statistics(self, route: _Route, weights: Tensor, start: int, T: int) -> None:
        """Add one block of rows ``start .. start + t`` of a call with ``T`` query rows."""
        site = route.site
        B, H, t, S = weights.shape
        query_mask, key_mask = self._masks_for(site, B, T, S, weights.device)
        ids = self._padding.get("input_ids")
        ids = ids if ids is not None and ids.shape == (B, S) and not site.cross else None
        self.recorder.add(site.name, weights, query_mask[:, start:start + t], key_mask, input_ids=ids, start=start,
                          rows=T, causal=bool(getattr(site.module, "is_causal", False)) and not site.cross)

    def row_counts(self) -> dict[str, list[int]]:
        """``{layer: [query rows counted per head]}`` behind :meth:`statistics`."""
        return self.recorder.row_counts()

    def statistics(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{layer: {statistic: [one value per head]}}`` over every forward since the block
        began (:meth:`~attnlab.inspect.compute.site_statistics.SiteStatistics.means`)."""
        return self.recorder.means()

    # -- interventions -----------------------------------------------------------------
    def module_of(self, name: str) -> nn.Module:
        """The attention module named ``name`` (``layer_2``, ``cross.layer_1``, ...)."""
        for site in self.sites:
            if site.name == name:
                return site.module
        raise ValueError(f"no attention layer {name!r}; this model has {', '.join(s.name for s in self.sites)}")

    def set_head_mask(self, head_mask: Union[Tensor, Mapping[str, Iterable[int]], None]) -> Optional[Tensor]:
        """Multiply each head's output by ``head_mask`` (``[L, H]``, or ``{"layer_2": [0, 3]}``:
        the heads to remove, 0-based); ``None`` removes the mask. Returns the ``[L, H]`` mask.

        The head mask of :func:`~attnlab.inspect.mask_heads` (validated by
        :func:`~attnlab.inspect.head_mask_from`: only the layers a mapping names need their
        number of heads), applied by attnlab's attention function to each head's weights and
        output (:func:`scale_heads`)."""
        self._head_masking.close()
        self._head_masking = contextlib.ExitStack()
        if head_mask is None:
            return None
        return self._head_masking.enter_context(scale_heads(self.model, self.sites, head_mask))

    def __repr__(self) -> str:
        chosen = "as output_attentions asks" if self.layers_asked is None else sorted(self.layers_asked)
        return f"AttachedModel({len(self.sites)} attention layers; exact weights: {chosen})"


def scale_heads(model: nn.Module, sites: Sequence[AttentionSite], head_mask: Union[Tensor, Mapping[str, Iterable[int]]]
                ) -> "contextlib.AbstractContextManager[Tensor]":
    """Heads of ``sites`` multiplied by ``head_mask`` (``[L, H]`` or ``{"layer_2": [0, 3]}``)
    inside the block: :func:`~attnlab.inspect.mask_heads` with the sites' names, for
    ``attach(head_mask=)`` and a ``TransformersModel``'s ``intervene`` alike."""
    return mask_heads(model, head_mask, modules={site.name: site.module for site in sites})


@contextlib.contextmanager
def attach(
    model: nn.Module,
    *,
    layers: Union[None, str, int, Sequence[Union[int, str]]] = None,
    heads: Optional[Sequence[int]] = None,
    statistics: bool = False,
    grad: bool = False,
    head_mask: Union[Tensor, Mapping[str, Iterable[int]], None] = None,
    sparsity_threshold: float = 0.1,
    top_k: int = 3,
    token_groups: Optional[Mapping[str, Iterable[int]]] = None,
) -> Iterator[AttachedModel]:
    """Run a transformers model's attention through attnlab inside the block.

    Args:
        model: a loaded transformers ``PreTrainedModel`` (any architecture whose attention
            goes through ``transformers.AttentionInterface``).
        layers: the layers whose exact weights are computed: numbers counted from 1
            (layer 3 of every stack), names (``"layer_3"``, ``"cross.layer_2"``) or
            ``"all"``. Default: the layers ``output_attentions=True`` asks for (all of
            them, when a call asks; none otherwise). The rest run the fused kernel.
        heads: keep only these heads' weights (0-based); default all.
        statistics: reduce the chosen layers' weights on the fly to the analyzer's
            statistics (:meth:`AttachedModel.statistics`) instead of keeping them; the
            weights are never held whole (blocks of query rows).
        grad: keep the weights in the autograd graph (for gradients through them).
        head_mask: ``[L, H]`` multipliers of each head's output, or
            ``{"layer_2": [0, 3]}`` (heads to remove, 0-based).
        sparsity_threshold, top_k, token_groups: as :class:`~attnlab.inspect.HeadStatistics`.

    Yields:
        :class:`AttachedModel`: the chosen self-attention layers' weights in
        ``seen.attentions``, the cross-attention ones (``"cross.layer_2"``) in
        ``seen.cross_attentions``, by attnlab's names.

    Example:
        >>> with attach(model, layers=[2]) as seen:
        ...     out = model(**batch)
        >>> seen.attentions["layer_2"].shape          # [B, H, T, S], exact
        >>> out.attentions                            # transformers' own tuple, when asked
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "set_attn_implementation"):
        raise TypeError(
            f"attach takes a loaded transformers model (PreTrainedModel), got {type(model).__name__}; "
            f"attnlab's own models take output_attentions=True directly"
        )
    unrouted = unrouted_attention(model)
    if unrouted:
        raise ValueError(
            f"{type(model).__name__}: {unrouted[0]} ({type(model.get_submodule(unrouted[0])).__name__}) computes "
            f"attention without transformers' AttentionInterface, so attnlab cannot serve it"
            + (f" (and {len(unrouted) - 1} more)" if len(unrouted) > 1 else "")
        )
    sites = attention_sites(model)
    if not sites:
        raise ValueError(f"{type(model).__name__} has no attention module that goes through AttentionInterface")
    busy = [site.path for site in sites if site.module in _ROUTES]
    if busy:
        raise RuntimeError(f"{type(model).__name__} is already attached (at {busy[0]}); one attach block at a time")
    if heads is not None:
        heads = [int(h) for h in heads]
        smallest = min((site.heads for site in sites if site.heads is not None), default=None)
        if not heads or (smallest is not None and any(not 0 <= h < smallest for h in heads)):
            raise ValueError(f"heads must be 0-based head indices below {smallest}, got {heads}")
    chosen = _select_layers(sites, layers)
    if statistics and chosen is None:
        chosen = {site.name for site in sites}
    session = AttachedModel(
        model, sites, chosen, heads, grad, statistics,
        {"sparsity_threshold": sparsity_threshold, "top_k": top_k, "token_groups": token_groups},
    )
    register()
    newly_served = {site.module: site.heads for site in sites if not is_served(site.module)}
    handles = []
    with implementation(model, BACKEND_NAME) as configs:
        use_eager_masks(model, configs)
        try:
            for site in sites:
                route = _ROUTES[site.module] = _Route(session, site, chosen is not None and site.name in chosen)
                handles.append(site.module.register_forward_pre_hook(route.enter))
            handles.append(model.register_forward_pre_hook(session._remember_call, with_kwargs=True))
            for submodule in model.modules():  # a submodel called on its own starts a pass too
                if submodule is not model and hasattr(submodule, "set_attn_implementation"):
                    handles.append(submodule.register_forward_pre_hook(session._new_forward, with_kwargs=True))
            serve_as_attention(newly_served)
            session.set_head_mask(head_mask)
            yield session
        finally:
            session.set_head_mask(None)
            for handle in handles:
                handle.remove()
            for site in sites:
                _ROUTES.pop(site.module, None)
            serve_as_attention(newly_served, serve=False)  # a TransformersModel's modules stay served

