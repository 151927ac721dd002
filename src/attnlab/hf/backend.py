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
from torch import Tensor, nn

from ..attention.interface import is_served, serve_as_attention
from ..inspect.compute.head_mask import mask_heads
from ..inspect.compute.query_rows import RowChoice
from ..inspect.compute.routing import Session, route_of, routed, select_layers
from ._kernel import BACKEND_NAME, use_eager_masks, register
from ._sites import AttentionSite, attention_sites, unrouted_attention

__all__ = ["AttachedModel", "attach", "route_of"]


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


class AttachedModel(Session):
    """What :func:`attach` yields: a :class:`~attnlab.inspect.compute.routing.Session` (the
    weights or statistics of the latest forward, by attnlab's names) that reads a
    transformers model's padding, decoder padding and ``output_attentions``, and sets head masks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_masking = contextlib.ExitStack()  # mask_heads' rows while a head mask is set

    def _remember_call(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The model's own call: its padding (for the statistics) and whether it asked for
        ``output_attentions`` (some models keep that flag instead of passing it down)."""
        super()._remember_call(module, args, kwargs)
        asked = kwargs.get("output_attentions")
        self.output_attentions_asked = bool(
            asked if asked is not None else getattr(getattr(module, "config", None), "output_attentions", False)
        )
        self._padding["decoder_attention_mask"] = kwargs.get("decoder_attention_mask")

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

    # -- interventions -----------------------------------------------------------------
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
    rows: RowChoice = None,
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
        rows: keep the weights of these query rows only, over every key: the last ``k``
            (an int), a span (``slice(1000, 1100)``) or positions (``[0, -1]``); their
            positions are in ``seen.query_rows``. The layer's output comes from the fused
            kernel and no ``[T, S]`` map is made, so this works at any context length.

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
    if heads is not None:
        heads = [int(h) for h in heads]
        smallest = min((site.heads for site in sites if site.heads is not None), default=None)
        if not heads or (smallest is not None and any(not 0 <= h < smallest for h in heads)):
            raise ValueError(f"heads must be 0-based head indices below {smallest}, got {heads}")
    chosen = select_layers(sites, layers)
    if statistics and chosen is None:
        chosen = {site.name for site in sites}
    session = AttachedModel(
        model, sites, chosen, heads, grad, statistics,
        {"sparsity_threshold": sparsity_threshold, "top_k": top_k, "token_groups": token_groups}, rows=rows,
    )
    register()
    newly_served = {site.module: site.heads for site in sites if not is_served(site.module)}
    handles = []
    with implementation(model, BACKEND_NAME) as configs, routed(session):
        use_eager_masks(model, configs)
        try:
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
            serve_as_attention(newly_served, serve=False)  # a TransformersModel's modules stay served
