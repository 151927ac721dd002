"""Activation patching on heads and layers (the method of TransformerLens), for every model.

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``H`` heads, ``D`` head
dim, ``L`` layers, ``C`` classes.

Run a *source* input and a *target* input of the same shape (unpadded: every position
is read as a real token); in a second run of the
target, replace chosen activations by the source's and read the change in one logit
of the target run. A head's output is its ``[B, T, D]`` slice before the output
projection mixes the heads, recorded and replaced through the model's
:meth:`~attnlab.inspect.compute.inspectable.Inspectable.head_outputs` (attnlab's models:
the output projection's input; transformers models: what attnlab's attention function
returns), so one implementation serves both doors. A layer's output is what the encoder
layer hands to the next one (the residual stream). The model runs in eval mode, hooks
removed in ``finally``. The logit read is a classifier's class logit, or a language
model's next-token logit at the last position.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from .attribution_target import logits_of, resolve_target
from .inspectable import inspectable, require
from .modes import eval_mode

__all__ = ["PatchResult", "patch_heads", "patch_layers", "head_patching_sweep", "layer_patching_sweep"]


@dataclass
class PatchResult:
    """The target logit with and without the patch.

    Attributes:
        label: the class whose logit is read.
        clean: ``[B]`` the target run's logit.
        source: ``[B]`` the source run's logit.
        patched: ``[B]`` the target run's logit with the source's activations patched in.
    """

    label: int
    clean: Tensor
    source: Tensor
    patched: Tensor

    @property
    def change(self) -> Tensor:
        """``patched - clean``."""
        return self.patched - self.clean

    @property
    def recovered(self) -> Tensor:
        """``(patched - clean) / (source - clean)``: the share of the difference the patch
        carries (1: all of it; NaN where source and target agree)."""
        return self.change / (self.source - self.clean)


Inputs = Union[Tensor, Mapping[str, Any]]


def _run(model: nn.Module, inputs: Inputs) -> Tensor:
    """The logits read: ``[B, C]`` of a classifier, the last position's ``[B, V]`` of a
    language model. ``inputs``: ids (every position real), or the model's keyword inputs."""
    if isinstance(inputs, Tensor):
        output = model(inputs, mask=torch.ones_like(inputs, dtype=torch.bool))
    else:
        output = model(**inputs)
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor) and logits.dim() == 3:
        return logits[:, -1]  # [B, V]: the next token after the text
    return logits_of(output)


def _shape(inputs: Inputs) -> tuple[int, ...]:
    ids = inputs if isinstance(inputs, Tensor) else inputs.get("input_ids", inputs.get("pixel_values"))
    return tuple(ids.shape) if isinstance(ids, Tensor) else ()


@contextlib.contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    with eval_mode(model), torch.no_grad():
        yield


def _check_pair(source: Inputs, target: Inputs) -> None:
    for name, inputs in (("source", source), ("target", target)):
        if isinstance(inputs, Tensor) and inputs.dim() != 2:
            raise ValueError(f"{name} ids must be a [B, T] tensor of ids")
    if _shape(source) != _shape(target) or not _shape(source):
        raise ValueError(
            f"source {_shape(source)} and target {_shape(target)} inputs must have the same shape: patching "
            f"replaces position by position, so both must be of one shape (pad or cut the texts to one length)"
        )


def _record_and_patch(model, source_ids, target_ids, sites, label) -> PatchResult:
    """``sites``: ``[(module, pre, select)]``; ``select(recorded, current)`` builds the patch."""
    recorded: dict[int, Tensor] = {}
    handles = []

    def recorder(index, pre):
        def hook(module, args, output=None):
            recorded[index] = (
                args[0] if pre else (output[0] if isinstance(output, tuple) else output)
            ).clone()

        return hook

    def patcher(index, pre, select):
        if pre:

            def hook(module, args):
                return (select(recorded[index], args[0]),) + tuple(args[1:])
        else:

            def hook(module, args, output):
                if isinstance(output, tuple):  # a named tuple (attnlab's layers) or a plain one
                    first = select(recorded[index], output[0])
                    if hasattr(output, "_fields"):
                        return output._replace(**{output._fields[0]: first})
                    return (first,) + tuple(output[1:])
                return select(recorded[index], output)

        return hook

    view = inspectable(model)
    with _eval(model):
        with view.head_outputs([]):  # the same kernels as the patched run: a patch of equal values changes nothing
            clean_logits = _run(view, target_ids)
        label_index = resolve_target(clean_logits, label, view.label_names)
        try:
            for index, (module, pre, _) in enumerate(sites):
                register = module.register_forward_pre_hook if pre else module.register_forward_hook
                handles.append(register(recorder(index, pre)))
            source_logits = _run(view, source_ids)
        finally:
            for handle in handles:
                handle.remove()
        handles = []
        try:
            for index, (module, pre, select) in enumerate(sites):
                register = module.register_forward_pre_hook if pre else module.register_forward_hook
                handles.append(register(patcher(index, pre, select)))
            patched_logits = _run(view, target_ids)
        finally:
            for handle in handles:
                handle.remove()
    pick = lambda logits: logits.gather(1, label_index[:, None])[:, 0].float()  # noqa: E731
    return PatchResult(int(label_index[0]), pick(clean_logits), pick(source_logits), pick(patched_logits))


def patch_heads(
    model: nn.Module,
    source_ids: Inputs,
    target_ids: Inputs,
    heads: Mapping[str, Iterable[int]],
    *,
    label: Optional[Union[int, str]] = None,
) -> PatchResult:
    """Patch the outputs of chosen heads from the source run into the target run.

    Args:
        model: a classifier or a language model (next-token logit): attnlab's, or a
            transformers model (served by attnlab's attention function).
        source_ids: ``[B, T]`` ids whose activations are patched in (or the model's
            keyword inputs, ``{"pixel_values": ...}``).
        target_ids: the inputs of the run that is changed, of the same shape.
        heads: ``{"layer_2": [0, 3]}``: 0-based heads per layer name.
        label: the class (index or label name) or next token whose logit is read;
            default the target run's prediction.

    Returns:
        :class:`PatchResult`.
    """
    _check_pair(source_ids, target_ids)
    view = inspectable(model)
    require(view, "head_outputs", "head patching")
    counts = {site.name: site.heads for site in view.attention_sites()}
    chosen_heads = {}
    for layer, chosen in heads.items():
        if layer not in counts:
            raise ValueError(f"unknown layer {layer!r}; the model has {list(counts)}")
        count = counts[layer]
        chosen = sorted({int(h) for h in chosen})
        if count is None or any(not 0 <= h < count for h in chosen):
            raise ValueError(f"{layer} has {count} heads (0-based indices 0..{(count or 1) - 1}), got {chosen}")
        selected = torch.zeros(count, dtype=torch.bool)
        selected[chosen] = True
        chosen_heads[layer] = selected
    with _eval(model):
        with view.head_outputs([]):  # the same kernels as the patched run: a patch of equal values changes nothing
            clean_logits = _run(view, target_ids)
        label_index = resolve_target(clean_logits, label, view.label_names)
        with view.head_outputs(list(chosen_heads)) as recorded:
            source_logits = _run(view, source_ids)
        replace = {layer: (selected, recorded[layer]) for layer, selected in chosen_heads.items()}
        with view.head_outputs([], replace=replace):
            patched_logits = _run(view, target_ids)
    pick = lambda logits: logits.gather(1, label_index[:, None])[:, 0].float()  # noqa: E731
    return PatchResult(int(label_index[0]), pick(clean_logits), pick(source_logits), pick(patched_logits))


def patch_layers(
    model: nn.Module,
    source_ids: Tensor,
    target_ids: Tensor,
    layers: Iterable[int],
    *,
    label: Optional[Union[int, str]] = None,
) -> PatchResult:
    """Patch whole layers' outputs (0-based indices of
    :meth:`~attnlab.inspect.compute.inspectable.Inspectable.blocks`: what each layer hands to
    the next, the residual stream) from the source run into the target run."""
    _check_pair(source_ids, target_ids)
    view = inspectable(model)
    require(view, "blocks", "layer patching")
    blocks = [block for _, block in view.blocks()]
    sites = []
    for index in layers:
        if not 0 <= int(index) < len(blocks):
            raise ValueError(f"layer index must lie in 0..{len(blocks) - 1} (0-based), got {index}")
        sites.append((blocks[int(index)], False, lambda recorded, current: recorded))
    return _record_and_patch(model, source_ids, target_ids, sites, label)


def _sweep_label(model: nn.Module, target_ids: Inputs, label: Optional[Union[int, str]]) -> Union[int, str]:
    """The label a sweep explains: the given one, else the target run's prediction (fixed
    once, so that every patched run is read at the same logit)."""
    if label is not None:
        return label
    with _eval(model):
        return int(_run(inspectable(model), target_ids).argmax(-1)[0])


def head_patching_sweep(
    model: nn.Module,
    source_ids: Inputs,
    target_ids: Inputs,
    *,
    label: Optional[Union[int, str]] = None,
    recovered: bool = False,
) -> Tensor:
    """Patch each head alone; the ``[L, H]`` map of the change in the target logit.

    Args:
        recovered: give ``(patched - clean) / (source - clean)`` instead of the change.

    Returns:
        ``[L, H]`` (mean over the batch); NaN for heads a layer does not have.
    """
    view = inspectable(model)
    require(view, "head_outputs", "head patching")
    sites = view.attention_sites()
    counts = [site.heads or 0 for site in sites]
    result = torch.full((len(counts), max(counts)), float("nan"))
    label = _sweep_label(model, target_ids, label)
    for row, (name, count) in enumerate(zip([site.name for site in sites], counts)):
        for head in range(count):
            patched = patch_heads(model, source_ids, target_ids, {name: [head]}, label=label)
            result[row, head] = (patched.recovered if recovered else patched.change).mean()
    return result


def layer_patching_sweep(
    model: nn.Module,
    source_ids: Tensor,
    target_ids: Tensor,
    *,
    label: Optional[Union[int, str]] = None,
    recovered: bool = False,
) -> Tensor:
    """Patch each layer's output alone; ``[L]`` changes in the target logit."""
    count = len(inspectable(model).blocks())
    label = _sweep_label(model, target_ids, label)
    values = []
    for index in range(count):
        patched = patch_layers(model, source_ids, target_ids, [index], label=label)
        values.append((patched.recovered if recovered else patched.change).mean())
    return torch.stack(values)
