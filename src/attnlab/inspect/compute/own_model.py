"""attnlab's own models as :class:`~attnlab.inspect.compute.inspectable.Inspectable`.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``E`` width, ``V`` vocabulary.

The attention modules are found as :func:`~attnlab.inspect.capture_attention` finds them
(every module taking ``need_weights``, innermost first). attnlab's own modules call their
attention function by name (:mod:`attnlab.attention.interface`): inside a block they call
the inspecting function transformers models are served by too
(:mod:`~attnlab.inspect.compute.routing`), which records weights, reduces them to
statistics block by block of query rows, masks heads and records or patches each head's
output before the output projection. A module of another kind that takes
``need_weights`` is served by forward hooks.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from ...attention.cross_modal import CrossModalAttention
from ...attention.interface import names_attention_function
from .attribution_target import is_causal_model
from .capture import attention_heads, capture_attention, find_attention_modules, module_paths, weights_asker
from .head_mask import mask_heads
from .inspectable import HeadMask, Site, residual_blocks, shared_reason, sliding_window, special_ids_of
from .modes import eval_mode
from .query_rows import RowChoice
from .routing import Route, Session, inspecting
from .site_statistics import SiteStatistics

__all__ = ["OwnModel", "as_inspectable"]


def _output_projection(module: nn.Module, name: str) -> tuple[nn.Module, int, int]:
    """An attention module's output projection (whose input holds each head's output), its
    number of heads and their width."""
    projection = getattr(module, "out_proj", None) or getattr(module, "o_proj", None)
    heads, width = getattr(module, "num_heads", None), getattr(module, "head_dim", None)
    if not isinstance(projection, nn.Module) or not isinstance(heads, int) or not isinstance(width, int):
        raise TypeError(
            f"{name} ({type(module).__name__}) has no out_proj, num_heads and head_dim; cannot patch its heads"
        )
    return projection, heads, width


class OwnModel:
    """What one of attnlab's models offers (see :class:`~attnlab.inspect.compute.inspectable.Inspectable`).

    Args:
        model: a model built from attnlab's attention modules (or modules that take
            ``need_weights`` and return ``(output, weights)``).

    Raises:
        ValueError: the model has no attention module.
    """

    def __init__(self, model: nn.Module) -> None:
        modules = find_attention_modules(model)
        if not modules:
            raise ValueError(f"{type(model).__name__} has no attention module attnlab can see (a MultiHeadAttention, "
                             f"or a forward with a need_weights keyword)")
        self.model = model
        self.architecture = type(model).__name__
        paths = module_paths(model)
        causal = is_causal_model(model)  # attnlab's decoder
        window = getattr(getattr(model, "config", None), "sliding_window", None) if causal else None
        self._sites = []
        for name, module in modules.items():
            cross = isinstance(module, CrossModalAttention)
            self._sites.append(Site(name, paths[name], module, attention_heads(module), cross, causal and not cross,
                                    window if isinstance(window, int) and not cross else None))
        if causal:
            self.kind = "decoder"
        elif any(site.cross for site in self._sites):
            self.kind = "image-text"
        else:
            self.kind = "encoder"
        names = getattr(model, "label_names", None)
        self.label_names = list(names) if names else None
        encoder = getattr(model, "encoder", None)
        self.special_ids = special_ids_of(getattr(model, "config", None) or getattr(encoder, "config", None))

    def __repr__(self) -> str:
        return f"OwnModel({type(self.model).__name__}, {self.kind}, {len(self._sites)} attention layers)"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def attention_sites(self) -> list[Site]:
        return list(self._sites)

    def unsupported(self, feature: str) -> Optional[str]:
        name = self.architecture
        if feature == "head_outputs":
            for site in self._sites:
                try:
                    _output_projection(site.module, site.name)
                except TypeError as error:
                    return str(error)
            return None
        if feature == "input_embeddings":
            return None if self._embedding() is not None else f"{name} has no token embedding"
        if feature == "readout":
            return None if self._readout_parts() is not None else (
                f"{name} has no final norm and language-model head; the logit lens needs a decoder")
        if feature == "generate":
            return None if self.kind == "decoder" else f"{name} is not a decoder; only decoders generate"
        return shared_reason(self, feature)

    def _chosen(self, layers: Optional[Sequence[str]]) -> dict[str, nn.Module]:
        by_name = {site.name: site.module for site in self._sites}
        if layers is None:
            return by_name
        unknown = [layer for layer in layers if layer not in by_name]
        if unknown:
            raise ValueError(f"no attention layer {unknown[0]!r}; this model has {', '.join(by_name)}")
        return {layer: by_name[layer] for layer in layers}

    def record(self, *, layers: Optional[Sequence[str]] = None, grad: bool = False, rows: RowChoice = None):
        """:func:`~attnlab.inspect.capture_attention` on the chosen layers (and query rows)."""
        return capture_attention(self.model, detach=not grad, modules=self._chosen(layers), rows=rows)

    def _routed(self) -> bool:
        """Whether every site calls attnlab's attention functions (attnlab's own modules do;
        a module of another kind taking ``need_weights`` is served by hooks)."""
        return all(names_attention_function(site.module) for site in self._sites)

    def _session(self, *, statistics: bool = False, options: Optional[dict] = None) -> Session:
        return Session(self.model, self._sites, set(self._chosen(None)), None, False, statistics, options or {},
                       refuse_shared_modules=False)

    @contextlib.contextmanager
    def statistics(self, *, sparsity_threshold: float = 0.1, top_k: int = 3,
                   token_groups: Optional[Mapping[str, Iterable[int]]] = None) -> Iterator[SiteStatistics]:
        """Statistics block by block of query rows inside the inspecting attention function
        (:mod:`~attnlab.inspect.compute.routing`), as on transformers models: no map is kept.
        A site of another kind hands its whole map, reduced as soon as it is made."""
        options = {"sparsity_threshold": sparsity_threshold, "top_k": top_k, "token_groups": token_groups}
        if self._routed():
            session = self._session(statistics=True, options=options)
            session.recorder.window = sliding_window(self._sites)
            with eval_mode(self.model), inspecting(session):
                yield session.recorder
            return
        session = self._session(options=options)
        session.recorder.window = sliding_window(self._sites)
        handles = [self.model.register_forward_pre_hook(session._remember_call, with_kwargs=True)]

        def reducer(site: Site):
            def hook(module: nn.Module, args: tuple, output: Any) -> None:
                weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
                if weights is None:
                    raise RuntimeError(f"{site.name} ({type(module).__name__}) returned no attention weights")
                T = weights.shape[-2]
                session._update_statistics(Route(session, site, True), weights, 0, T)

            return hook

        try:
            for site in self._sites:
                handles.append(site.module.register_forward_pre_hook(weights_asker(site.module), with_kwargs=True))
                handles.append(site.module.register_forward_hook(reducer(site)))
            with eval_mode(self.model):
                yield session.recorder
        finally:
            for handle in handles:
                handle.remove()

    def intervene(self, *, head_mask: HeadMask):
        """:func:`~attnlab.inspect.mask_heads`: each head's output scaled before the output projection."""
        return mask_heads(self.model, head_mask)

    @contextlib.contextmanager
    def head_outputs(self, layers: Sequence[str], *,
                     replace: Optional[Mapping[str, tuple[Tensor, Tensor]]] = None) -> Iterator[dict[str, Tensor]]:
        """The inspecting attention function records (and replaces) each head's output
        ``[B, T, H, D]`` as it returns it, before the module's output projection, as on
        transformers models; a site of another kind, through a pre-hook on its output projection."""
        if self._routed():
            with inspecting(self._session()) as session:
                yield session.watch_head_outputs(layers, replace)
            return
        recorded: dict[str, Tensor] = {}
        replace = dict(replace or {})

        def hook_for(layer: str, heads: int, width: int):
            def hook(module: nn.Module, args: tuple) -> Optional[tuple]:
                x = args[0]
                per_head = x.reshape(*x.shape[:-1], heads, width)  # [B, T, H, D]
                recorded[layer] = per_head.detach().clone()
                if layer not in replace:
                    return None
                chosen, values = replace[layer]
                patched = torch.where(chosen.to(x.device)[:, None], values.to(x.dtype), per_head)
                return (patched.reshape(x.shape),) + tuple(args[1:])

            return hook

        modules = self._chosen(list(dict.fromkeys([*layers, *replace])))
        handles = []
        try:
            for layer, module in modules.items():
                projection, heads, width = _output_projection(module, layer)
                handles.append(projection.register_forward_pre_hook(hook_for(layer, heads, width)))
            yield recorded
        finally:
            for handle in handles:
                handle.remove()

    def blocks(self) -> list[tuple[str, nn.Module]]:
        return residual_blocks(self.model, self._sites)

    def _embedding(self) -> Optional[nn.Module]:
        for name in ("embed_tokens", "embedding"):
            module = getattr(self.model, name, None)
            if isinstance(module, nn.Embedding):
                return module
        encoder = getattr(self.model, "encoder", None)
        module = getattr(encoder, "embedding", None)
        return module if isinstance(module, nn.Embedding) else None

    def input_embeddings(self) -> nn.Module:
        embedding = self._embedding()
        if embedding is None:
            raise ValueError(f"input_embeddings: {self.unsupported('input_embeddings')}")
        return embedding

    def _readout_parts(self) -> Optional[tuple[nn.Module, nn.Module]]:
        norm, head = getattr(self.model, "norm", None), getattr(self.model, "lm_head", None)
        if self.kind == "decoder" and isinstance(norm, nn.Module) and isinstance(head, nn.Module):
            return norm, head
        return None

    def readout(self) -> Callable[[Tensor], Tensor]:
        parts = self._readout_parts()
        if parts is None:
            raise ValueError(f"readout: {self.unsupported('readout')}")
        norm, head = parts
        return lambda hidden: head(norm(hidden))

    def generate(self, input_ids: Tensor, *, attention_mask: Optional[Tensor] = None, max_new_tokens: int = 20,
                 **options: Any) -> Any:
        if self.kind != "decoder":
            raise ValueError(f"generate: {self.unsupported('generate')}")
        options.setdefault("output_attentions", True)
        return self.model.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens, **options)


def as_inspectable(model: nn.Module) -> OwnModel:
    """One of attnlab's models as :class:`~attnlab.inspect.compute.inspectable.Inspectable`."""
    return OwnModel(model)
