"""Activation patching of heads on a transformers model, through the backend.

Dimension letters: ``B`` batch, ``T`` length, ``H`` heads, ``D`` head dim, ``L`` layers,
``C`` classes (or the vocabulary, for a language model's next token).

As :mod:`attnlab.inspect.compute.patching` does for attnlab's models: run a *source* and a
*target* input of one shape, then the target again with chosen heads' outputs replaced by
the source's, and read one logit. A head's output is its ``[B, T, D]`` slice of what the
attention function returns (``[B, T, H, D]``, before the output projection mixes the
heads), which attnlab's function records and replaces itself: no model code is touched.
The logit read is a classifier's class logit, or a language model's next-token logit at
the last position.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from ..inspect.compute.attribution_target import resolve_target
from ..inspect.compute.patching import PatchResult
from ._routes import route_of
from .backend import AttachedModel, attach

__all__ = ["patch_heads", "head_patching_sweep"]

Inputs = Union[Tensor, Mapping[str, Any]]


def _call(model: nn.Module, inputs: Inputs) -> Tensor:
    """The logits read: ``[B, C]`` of a classifier, the last position's ``[B, V]`` of a language model."""
    output = model(input_ids=inputs) if isinstance(inputs, Tensor) else model(**inputs)
    logits = getattr(output, "logits", None)
    if not isinstance(logits, Tensor):
        raise TypeError(f"{type(model).__name__} returns no logits; patching reads a class or next-token logit")
    return logits[:, -1] if logits.dim() == 3 else logits


def _shape(inputs: Inputs) -> tuple[int, ...]:
    ids = inputs if isinstance(inputs, Tensor) else inputs.get("input_ids", inputs.get("pixel_values"))
    return tuple(ids.shape) if isinstance(ids, Tensor) else ()


def _label_names(model: nn.Module) -> Optional[list[str]]:
    labels = getattr(getattr(model, "config", None), "id2label", None) or {}
    return [str(labels[index]) for index in sorted(labels)] if len(labels) > 1 else None


def _patched_run(seen: AttachedModel, model: nn.Module, source: Inputs, target: Inputs,
                 heads: Mapping[str, Iterable[int]], label_index: Tensor) -> tuple[Tensor, Tensor]:
    routes = {}
    for layer, chosen in heads.items():
        route = route_of(seen.module_of(layer))
        chosen = sorted({int(head) for head in chosen})
        count = route.site.heads
        if count is None or any(not 0 <= head < count for head in chosen):
            raise ValueError(f"{layer} has {count} heads (0-based indices 0..{(count or 1) - 1}), got {chosen}")
        selected = torch.zeros(count, dtype=torch.bool)
        selected[chosen] = True
        routes[layer] = (route, selected)
    try:
        for route, _ in routes.values():
            route.record_output = True
        source_logits = _call(model, source)
    finally:
        for route, _ in routes.values():
            route.record_output = False
    try:
        for layer, (route, selected) in routes.items():
            route.patch = (selected, seen.head_outputs[layer])
        patched_logits = _call(model, target)
    finally:
        for route, _ in routes.values():
            route.patch = None
    pick = lambda logits: logits.gather(1, label_index[:, None])[:, 0].float()  # noqa: E731
    return pick(source_logits), pick(patched_logits)


@contextlib.contextmanager
def _patching(model: nn.Module, source: Inputs, target: Inputs, label: Optional[Union[int, str]]
              ) -> Iterator[tuple[AttachedModel, Tensor, Tensor]]:
    """Eval mode, no gradients, the backend attached, the target's clean run: yields the
    session, the label read ``[B]`` and the clean logit ``[B]``; modes restored after."""
    if _shape(source) != _shape(target) or not _shape(source):
        raise ValueError(f"source {_shape(source)} and target {_shape(target)} inputs must have one shape: "
                         f"patching replaces position by position")
    training = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad(), attach(model) as seen:
            clean = _call(model, target)
            label_index = resolve_target(clean, label, _label_names(model))
            yield seen, label_index, clean.gather(1, label_index[:, None])[:, 0].float()
    finally:
        for module, mode in training.items():
            module.training = mode


def patch_heads(
    model: nn.Module,
    source: Inputs,
    target: Inputs,
    heads: Mapping[str, Iterable[int]],
    *,
    label: Optional[Union[int, str]] = None,
) -> PatchResult:
    """Patch chosen heads' outputs from the source run into the target run.

    Args:
        model: a transformers classifier or language model served through the registry.
        source, target: ``input_ids`` ``[B, T]`` or the model's keyword inputs, of one shape.
        heads: ``{"layer_2": [0, 3]}``: 0-based heads per layer name (see
            :func:`~attnlab.hf.attention_sites`).
        label: the class (index or label name) or next token id whose logit is read;
            default the target run's prediction.

    Returns:
        :class:`~attnlab.inspect.PatchResult`.
    """
    with _patching(model, source, target, label) as (seen, label_index, clean):
        source_logit, patched = _patched_run(seen, model, source, target, heads, label_index)
    return PatchResult(int(label_index[0]), clean, source_logit, patched)


def head_patching_sweep(
    model: nn.Module,
    source: Inputs,
    target: Inputs,
    *,
    label: Optional[Union[int, str]] = None,
    recovered: bool = False,
) -> Tensor:
    """Patch each head alone: the ``[L, H]`` map of the change in the target logit (mean over
    the batch; NaN for heads a layer does not have), layers in the order of
    :func:`~attnlab.hf.attention_sites`.

    Args:
        recovered: give ``(patched - clean) / (source - clean)`` instead of the change.
    """
    with _patching(model, source, target, label) as (seen, label_index, clean_logit):
        names = [site.name for site in seen.sites]
        counts = [site.heads or 0 for site in seen.sites]
        result = torch.full((len(names), max(counts)), float("nan"))
        for row, (name, count) in enumerate(zip(names, counts)):
            for head in range(count):
                source_logit, patched = _patched_run(seen, model, source, target, {name: [head]}, label_index)
                change = patched - clean_logit
                result[row, head] = (change / (source_logit - clean_logit) if recovered else change).mean()
    return result
