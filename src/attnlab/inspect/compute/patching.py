"""Activation patching on heads and layers (the method of TransformerLens, for attnlab models).

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``H`` heads, ``D`` head
dim, ``L`` layers, ``C`` classes.

Run a *source* input and a *target* input of the same shape (unpadded: every position
is read as a real token); in a second run of the
target, replace chosen activations by the source's and read the change in one logit
of the target run. A head's output is its slice ``[h * D, (h + 1) * D)`` of the
attention's output-projection input (the heads concatenated, before they are mixed);
a layer's output is what the encoder layer hands to the next one (the residual
stream). Everything runs through hooks removed in ``finally``; the model in eval mode.
The logit read is a classifier's class logit, or a causal language model's next-token logit
at the last position (attnlab's decoders: their heads meet at ``o_proj``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from .attribution_target import encoder_of, is_causal_model, logits_of, resolve_target
from .capture import find_attention_modules

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


def _heads_of(module: nn.Module, name: str) -> tuple[nn.Module, int, int]:
    projection = getattr(module, "out_proj", None) or getattr(module, "o_proj", None)
    heads, width = getattr(module, "num_heads", None), getattr(module, "head_dim", None)
    if not isinstance(projection, nn.Module) or not isinstance(heads, int) or not isinstance(width, int):
        raise TypeError(
            f"{name} ({type(module).__name__}) has no out_proj, num_heads and head_dim; cannot patch its heads"
        )
    return projection, heads, width


def _run(model: nn.Module, input_ids: Tensor) -> Tensor:
    output = model(input_ids, mask=torch.ones_like(input_ids, dtype=torch.bool))
    logits = getattr(output, "logits", None)
    if isinstance(logits, Tensor) and logits.dim() == 3 and is_causal_model(model):
        return logits[:, -1]  # [B, V]: the next token after the text
    return logits_of(output)


@contextlib.contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, mode in modes.items():
            module.training = mode


def _check_pair(source_ids: Tensor, target_ids: Tensor) -> None:
    for name, ids in (("source_ids", source_ids), ("target_ids", target_ids)):
        if not isinstance(ids, Tensor) or ids.dim() != 2:
            raise ValueError(f"{name} must be a [B, T] tensor of ids")
    if source_ids.shape != target_ids.shape:
        raise ValueError(
            f"source_ids {tuple(source_ids.shape)} and target_ids {tuple(target_ids.shape)} must have the same "
            f"shape: patching replaces position by position (pad or cut the texts to one length)"
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
                if isinstance(output, tuple):
                    return type(output)(select(recorded[index], output[0]), *output[1:])
                return select(recorded[index], output)

        return hook

    with _eval(model):
        clean_logits = _run(model, target_ids)
        label_index = resolve_target(clean_logits, label, getattr(model, "label_names", None))
        try:
            for index, (module, pre, _) in enumerate(sites):
                register = module.register_forward_pre_hook if pre else module.register_forward_hook
                handles.append(register(recorder(index, pre)))
            source_logits = _run(model, source_ids)
        finally:
            for handle in handles:
                handle.remove()
        handles = []
        try:
            for index, (module, pre, select) in enumerate(sites):
                register = module.register_forward_pre_hook if pre else module.register_forward_hook
                handles.append(register(patcher(index, pre, select)))
            patched_logits = _run(model, target_ids)
        finally:
            for handle in handles:
                handle.remove()
    pick = lambda logits: logits.gather(1, label_index[:, None])[:, 0].float()  # noqa: E731
    return PatchResult(int(label_index[0]), pick(clean_logits), pick(source_logits), pick(patched_logits))


def patch_heads(
    model: nn.Module,
    source_ids: Tensor,
    target_ids: Tensor,
    heads: Mapping[str, Iterable[int]],
    *,
    label: Optional[Union[int, str]] = None,
) -> PatchResult:
    """Patch the outputs of chosen heads from the source run into the target run.

    Args:
        model: a classifier or a decoder (next-token logit) on attnlab attention.
        source_ids: ``[B, T]`` ids whose activations are patched in.
        target_ids: ``[B, T]`` ids of the run that is changed.
        heads: ``{"layer_2": [0, 3]}``: 0-based heads per layer name.
        label: the class whose logit is read; default the target run's prediction.

    Returns:
        :class:`PatchResult`.
    """
    _check_pair(source_ids, target_ids)
    modules = find_attention_modules(model)
    sites = []
    for layer, chosen in heads.items():
        if layer not in modules:
            raise ValueError(f"unknown layer {layer!r}; the model has {list(modules)}")
        projection, count, width = _heads_of(modules[layer], layer)
        chosen = sorted({int(h) for h in chosen})
        if any(not 0 <= h < count for h in chosen):
            raise ValueError(f"{layer} has {count} heads (0-based indices 0..{count - 1}), got {chosen}")
        columns = torch.zeros(count * width, dtype=torch.bool)
        for h in chosen:
            columns[h * width : (h + 1) * width] = True

        def select(recorded, current, columns=columns):
            return torch.where(columns.to(current.device), recorded, current)  # [B, T, E]: heads side by side

        sites.append((projection, True, select))
    return _record_and_patch(model, source_ids, target_ids, sites, label)


def patch_layers(
    model: nn.Module,
    source_ids: Tensor,
    target_ids: Tensor,
    layers: Iterable[int],
    *,
    label: Optional[Union[int, str]] = None,
) -> PatchResult:
    """Patch whole encoder layers' outputs (0-based indices) from the source run into the target run."""
    _check_pair(source_ids, target_ids)
    blocks = encoder_of(model).layers
    sites = []
    for index in layers:
        if not 0 <= int(index) < len(blocks):
            raise ValueError(f"layer index must lie in 0..{len(blocks) - 1} (0-based), got {index}")
        sites.append((blocks[int(index)], False, lambda recorded, current: recorded))
    return _record_and_patch(model, source_ids, target_ids, sites, label)


def _sweep_label(model: nn.Module, target_ids: Tensor, label: Optional[Union[int, str]]) -> Union[int, str]:
    """The label a sweep explains: the given one, else the target run's prediction (fixed
    once, so that every patched run is read at the same logit)."""
    if label is not None:
        return label
    with _eval(model):
        return int(_run(model, target_ids).argmax(-1)[0])


def head_patching_sweep(
    model: nn.Module,
    source_ids: Tensor,
    target_ids: Tensor,
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
    modules = find_attention_modules(model)
    counts = [_heads_of(module, name)[1] for name, module in modules.items()]
    result = torch.full((len(counts), max(counts)), float("nan"))
    label = _sweep_label(model, target_ids, label)
    for row, (name, count) in enumerate(zip(modules, counts)):
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
    count = len(encoder_of(model).layers)
    label = _sweep_label(model, target_ids, label)
    values = []
    for index in range(count):
        patched = patch_layers(model, source_ids, target_ids, [index], label=label)
        values.append((patched.recovered if recovered else patched.change).mean())
    return torch.stack(values)
