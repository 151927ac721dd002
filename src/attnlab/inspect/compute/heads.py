"""Switch heads off, and rank them by importance (Michel, Levy & Neubig, 2019).

Dimension letters: ``L`` attention modules (layers), ``H`` heads, ``B`` batch.

Both work through forward pre-hooks on the model's attention modules, which receive a
``head_mask`` keyword (``[H]``, multiplying each head's output): no model code changes,
and the hooks are removed in ``finally``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .batches import as_analysis_batch
from .capture import attention_heads, find_attention_modules

__all__ = ["mask_heads", "head_mask_from", "head_importance", "default_loss", "forward_batch"]

LossFn = Callable[[Any, Any], Tensor]


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


def head_mask_from(model: nn.Module, heads: Union[Tensor, Mapping[str, Iterable[int]]]) -> Tensor:
    """A ``[L, H]`` float mask: 1 keeps a head, 0 removes it.

    Args:
        model: the model whose attention modules the mask addresses.
        heads: a ``[L, H]`` tensor (returned as float), or ``{"layer_2": [0, 3]}``: the
            heads to remove (0-based) in each named layer.
    """
    modules = find_attention_modules(model)
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
def mask_heads(model: nn.Module, head_mask: Union[Tensor, Mapping[str, Iterable[int]]]) -> Iterator[Tensor]:
    """Multiply each attention head's output by ``head_mask`` inside the block.

    The head-masking switch for ablations: ``with mask_heads(model, {"layer_1": [2]}):``
    evaluates the model without head 2 of layer 1. A ``head_mask`` the model itself
    passes is multiplied with this one. A tensor that requires grad keeps its graph,
    which :func:`head_importance` uses.

    Args:
        model: model with attention modules taking a ``head_mask`` keyword.
        head_mask: ``[L, H]`` multipliers, or ``{"layer_k": [heads to remove]}``.

    Yields:
        the ``[L, H]`` mask in use.
    """
    modules = find_attention_modules(model)
    mask = head_mask_from(model, head_mask)
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


def forward_batch(model: nn.Module, batch: Any, pad_id: Optional[int] = None) -> Any:
    """Run ``model`` on one dataloader batch (see :mod:`attnlab.inspect.compute.batches`).

    The padding mask goes to the model whenever it is known (given by the batch or found
    from ``pad_id``), so the model never attends to padding the statistics leave out.
    """
    normalised = as_analysis_batch(batch, pad_id)
    if normalised.mask_given or pad_id is not None:
        return model(normalised.input_ids, mask=normalised.mask)
    return model(normalised.input_ids)


def default_loss(output: Any, batch: Any) -> Tensor:
    """Cross-entropy of ``output.logits`` (or ``output[0]`` when 2-D) against the batch's labels."""
    labels = as_analysis_batch(batch).labels
    logits = getattr(output, "logits", None)
    if (
        logits is None
        and isinstance(output, (tuple, list))
        and isinstance(output[0], Tensor)
        and output[0].dim() == 2
    ):
        logits = output[0]
    if logits is None or labels is None:
        raise ValueError(
            "head importance needs a loss: the default takes the model's logits and the batch's labels "
            "(batch[1] or batch['labels']); for other models pass loss_fn(output, batch) -> scalar"
        )
    return F.cross_entropy(logits.float(), labels.to(logits.device))


def head_importance(
    model: nn.Module,
    dataloader: Iterable[Any],
    *,
    loss_fn: Optional[LossFn] = None,
    pad_id: Optional[int] = None,
    normalize: bool = False,
) -> Tensor:
    """Head importance ``I_h = sum over batches |dLoss/d xi_h|`` at the all-ones head mask ``xi``.

    This is Michel et al. (2019), "Are Sixteen Heads Really Better than One?", as in
    HuggingFace's bertology script: the gradient of each batch's (mean) loss with respect
    to a multiplier on every head's output, in absolute value, summed over batches and
    divided by the number of batches. Computed in eval mode (no dropout).

    Args:
        model: a model with attention modules that take ``head_mask``.
        dataloader: batches as in :mod:`attnlab.inspect.compute.batches`.
        loss_fn: ``loss_fn(output, batch) -> scalar``; default cross-entropy of the
            logits against the batch's labels.
        pad_id: padding id, when batches carry no mask.
        normalize: divide each layer's scores by their L2 norm (Michel et al., Sec. 4.2).

    Returns:
        ``[L, H]`` float tensor.
    """
    loss_fn = loss_fn or default_loss
    modules = find_attention_modules(model)
    counts = _heads_per_layer(modules)
    total = torch.zeros(len(counts), max(counts), dtype=torch.float64)
    batches = 0
    dtype = next((p.dtype for p in model.parameters() if p.dtype.is_floating_point), torch.float32)
    training = {module: module.training for module in model.modules()}
    model.eval()
    try:
        for batch in dataloader:
            xi = torch.ones(len(counts), max(counts), dtype=dtype, requires_grad=True)
            with mask_heads(model, xi):
                loss = loss_fn(forward_batch(model, batch, pad_id), batch)
            (gradient,) = torch.autograd.grad(loss, xi)
            total += gradient.abs().double()
            batches += 1
    finally:
        for module, mode in training.items():
            module.training = mode
    if batches == 0:
        raise ValueError("dataloader yielded no batch")
    importance = total / batches
    if normalize:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp_min(1e-20)
    return importance.float()
