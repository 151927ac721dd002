"""attnlab's own models as :class:`~attnlab.inspect.compute.inspectable.Inspectable`.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``E`` width, ``V`` vocabulary.

The attention modules are found as :func:`~attnlab.inspect.capture_attention` finds them
(every module taking ``need_weights``, innermost first) and are asked for their weights
through forward pre-hooks, which change nothing in the model. Head interventions go
through the ``head_mask`` each attention module multiplies its heads' outputs by before
the output projection (:func:`~attnlab.inspect.mask_heads`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from ...attention.cross_modal import CrossModalAttention
from .attribution_target import is_causal_model
from .capture import attention_heads, capture_attention, find_attention_modules, module_paths, weights_asker
from .head_mask import mask_heads
from .inspectable import HeadMask, Site, residual_blocks, shared_reason, special_ids_of
from .modes import eval_mode
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
        self._sites = []
        for name, module in modules.items():
            cross = isinstance(module, CrossModalAttention)
            self._sites.append(Site(name, paths[name], module, attention_heads(module), cross, causal and not cross))
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

    def record(self, *, layers: Optional[Sequence[str]] = None, grad: bool = False):
        """:func:`~attnlab.inspect.capture_attention` on the chosen layers."""
        return capture_attention(self.model, detach=not grad, modules=self._chosen(layers))

    @contextlib.contextmanager
    def statistics(self, *, sparsity_threshold: float = 0.1, top_k: int = 3,
                   token_groups: Optional[Mapping[str, Iterable[int]]] = None) -> Iterator[SiteStatistics]:
        """Each layer's map is reduced to the statistics as soon as the layer made it."""
        recorder = SiteStatistics(sparsity_threshold=sparsity_threshold, top_k=top_k, token_groups=token_groups)
        call: dict[str, Optional[Tensor]] = {}

        def remember(module: nn.Module, args: tuple, kwargs: dict) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("mask", kwargs.get("attention_mask", args[1] if len(args) > 1 else None))
            call["ids"] = ids if isinstance(ids, Tensor) and ids.dim() == 2 else None
            call["mask"] = mask if isinstance(mask, Tensor) and mask.dim() == 2 else None

        def reducer(site: Site):
            def hook(module: nn.Module, args: tuple, output: Any) -> None:
                weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
                if weights is None:
                    raise RuntimeError(f"{site.name} ({type(module).__name__}) returned no attention weights")
                B, _, T, S = weights.shape
                mask, ids = call.get("mask"), call.get("ids")
                fits = mask is not None and mask.shape[0] == B
                query_mask = (mask[:, -T:] if fits and mask.shape[1] >= T and not site.cross
                              else weights.new_ones(B, T, dtype=bool))
                key_mask = (mask if fits and mask.shape[1] == S and not site.cross
                            else weights.new_ones(B, S, dtype=bool))
                ids = ids if ids is not None and ids.shape == (B, S) and not site.cross else None
                recorder.add(site.name, weights, query_mask.bool(), key_mask.bool(), causal=site.causal,
                             input_ids=ids, rows=T)

            return hook

        handles = [self.model.register_forward_pre_hook(remember, with_kwargs=True)]
        try:
            for site in self._sites:
                handles.append(site.module.register_forward_pre_hook(weights_asker(site.module), with_kwargs=True))
                handles.append(site.module.register_forward_hook(reducer(site)))
            with eval_mode(self.model):
                yield recorder
        finally:
            for handle in handles:
                handle.remove()

    def intervene(self, *, head_mask: HeadMask):
        """:func:`~attnlab.inspect.mask_heads`: each head's output scaled before the output projection."""
        return mask_heads(self.model, head_mask)

    @contextlib.contextmanager
    def head_outputs(self, layers: Sequence[str], *,
                     replace: Optional[Mapping[str, tuple[Tensor, Tensor]]] = None) -> Iterator[dict[str, Tensor]]:
        """Pre-hooks on each layer's output projection, whose input is the heads side by side
        ``[B, T, H * D]``."""
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
