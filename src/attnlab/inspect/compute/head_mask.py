"""Switch heads off: each head's weights and output multiplied by a mask before the output projection.

Dimension letters: ``L`` attention modules (layers), ``H`` heads.

The one way heads are switched off, for both doors. Every module that calls one of
attnlab's attention functions (attnlab's own modules, and a transformers module served by
attnlab's backend) has its row set in a table those functions read
(:func:`~attnlab.attention.interface.set_head_scale`), since not every module's ``forward``
passes a keyword on; any other module taking a ``head_mask`` keyword gets it from a
forward pre-hook. No model code changes; hooks and rows are removed in ``finally``.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from ...attention.interface import calls_attention_function, head_scale_of, set_head_scale
from .capture import attention_heads, find_attention_modules

__all__ = ["head_mask_from", "head_scale_of", "mask_heads"]

def _refuse(name: str, module: nn.Module) -> TypeError:
    return TypeError(f"{name} ({type(module).__name__}) does not say its number of heads (no int num_heads); "
                     f"its heads cannot be masked")


def head_mask_from(model: nn.Module, heads: Union[Tensor, Mapping[str, Iterable[int]]], *,
                   modules: Optional[Mapping[str, nn.Module]] = None) -> Tensor:
    """A ``[L, H]`` float mask: 1 keeps a head, 0 removes it.

    Args:
        model: the model whose attention modules the mask addresses.
        heads: a ``[L, H]`` tensor (returned as float), or ``{"layer_2": [0, 3]}``: the
            heads to remove (0-based) in each named layer. Only the layers a mapping names
            need to say their number of heads.
        modules: the attention modules by name (default :func:`find_attention_modules`'s).
    """
    modules = find_attention_modules(model) if modules is None else modules
    names = list(modules)
    counts = [attention_heads(module) for module in modules.values()]
    L, H = len(counts), max((count for count in counts if count), default=0)
    if isinstance(heads, Tensor):
        if None in counts:
            raise _refuse(names[counts.index(None)], modules[names[counts.index(None)]])
        if heads.shape != (L, H):
            raise ValueError(f"head mask must be [L, H] = [{L}, {H}] (layers {', '.join(names)}), "
                             f"got {tuple(heads.shape)}")
        return heads if heads.dtype.is_floating_point else heads.float()
    mask = torch.ones(L, H)
    for layer, removed in heads.items():
        if layer not in modules:
            raise ValueError(f"unknown layer {layer!r}; the model has {names}")
        row = names.index(layer)
        if counts[row] is None:
            raise _refuse(layer, modules[layer])
        for head in removed:
            if isinstance(head, bool) or not 0 <= int(head) < counts[row]:
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

    scaled: dict[nn.Module, Optional[Tensor]] = {}  # module -> the row it had before
    try:
        for module, row in zip(modules.values(), mask):
            heads = attention_heads(module)
            if heads is None:  # a layer that does not say its heads is never named (head_mask_from)
                continue
            if calls_attention_function(module):
                earlier = scaled[module] = head_scale_of(module)
                set_head_scale(module, row[:heads] if earlier is None else earlier * row[:heads])
            else:
                handles.append(module.register_forward_pre_hook(hook_for(row[:heads]), with_kwargs=True))
        yield mask
    finally:
        for handle in handles:
            handle.remove()
        for module, earlier in scaled.items():
            set_head_scale(module, earlier)
