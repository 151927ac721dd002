"""Switch heads off: each head's output multiplied by a mask before the output projection.

Dimension letters: ``L`` attention modules (layers), ``H`` heads.

Forward pre-hooks on the model's attention modules hand them a ``head_mask`` keyword
(``[H]``, multiplying each head's output): no model code changes, and the hooks are
removed in ``finally``. attnlab's attention modules and the transformers modules attnlab's
attention function serves both take it, so this is the one way heads are switched off.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from .capture import attention_heads, find_attention_modules

__all__ = ["head_mask_from", "mask_heads"]


def _heads_per_layer(modules: Mapping[str, nn.Module]) -> list[int]:
    counts = []
    for name, module in modules.items():
        heads = attention_heads(module)
        if heads is None:
            raise TypeError(
                f"{name} ({type(module).__name__}) has no int num_heads attribute; cannot mask its heads"
            )
        counts.append(heads)
    return counts


def head_mask_from(model: nn.Module, heads: Union[Tensor, Mapping[str, Iterable[int]]], *,
                   modules: Optional[Mapping[str, nn.Module]] = None) -> Tensor:
    """A ``[L, H]`` float mask: 1 keeps a head, 0 removes it.

    Args:
        model: the model whose attention modules the mask addresses.
        heads: a ``[L, H]`` tensor (returned as float), or ``{"layer_2": [0, 3]}``: the
            heads to remove (0-based) in each named layer.
        modules: the attention modules by name (default :func:`find_attention_modules`'s).
    """
    modules = find_attention_modules(model) if modules is None else modules
    counts = _heads_per_layer(modules)
    L, H = len(counts), max(counts)
    if isinstance(heads, Tensor):
        if heads.shape != (L, H):
            raise ValueError(f"head mask must be [L, H] = [{L}, {H}], got {tuple(heads.shape)}")
        return heads if heads.dtype.is_floating_point else heads.float()
    mask = torch.ones(L, H)
    names = list(modules)
    for layer, removed in heads.items():
        if layer not in modules:
            raise ValueError(f"unknown layer {layer!r}; the model has {names}")
        row = names.index(layer)
        for head in removed:
            if not 0 <= int(head) < counts[row]:
                raise ValueError(f"{layer} has {counts[row]} heads (0-based indices 0..{counts[row] - 1}; "
                                 f"--mask-heads counts them 1..{counts[row]}), got head index {head} "
                                 f"(head {int(head) + 1} counted from 1)")
            mask[row, int(head)] = 0.0
    return mask


@contextlib.contextmanager
def mask_heads(model: nn.Module, head_mask: Union[Tensor, Mapping[str, Iterable[int]]], *,
               modules: Optional[Mapping[str, nn.Module]] = None) -> Iterator[Tensor]:
    """Multiply each attention head's output by ``head_mask`` inside the block.

    The head-masking switch for ablations: ``with mask_heads(model, {"layer_1": [2]}):``
    evaluates the model without head 2 of layer 1. A ``head_mask`` the model itself
    passes is multiplied with this one. A tensor that requires grad keeps its graph,
    which :func:`head_importance` uses.

    Args:
        model: model with attention modules taking a ``head_mask`` keyword.
        head_mask: ``[L, H]`` multipliers, or ``{"layer_k": [heads to remove]}``.
        modules: the attention modules by name (default :func:`find_attention_modules`'s;
            a transformers model's are named by its sites, ``encoder.layer_1``, ...).

    Yields:
        the ``[L, H]`` mask in use.
    """
    modules = find_attention_modules(model) if modules is None else dict(modules)
    mask = head_mask_from(model, head_mask, modules=modules)
    handles = []

    def hook_for(row: Tensor):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            given = kwargs.get("head_mask")
            return args, {**kwargs, "head_mask": row if given is None else given * row}

        return hook

    try:
        for (name, module), row, heads in zip(modules.items(), mask, _heads_per_layer(modules)):
            handles.append(module.register_forward_pre_hook(hook_for(row[:heads]), with_kwargs=True))
        yield mask
    finally:
        for handle in handles:
            handle.remove()
