"""Rank heads by importance (Michel, Levy & Neubig, 2019); run a model on one batch.

Dimension letters: ``L`` attention modules (layers), ``H`` heads, ``B`` batch.

Importance is the gradient of the loss with respect to a multiplier on each head's
output, set through the model's head interventions
(:meth:`~attnlab.inspect.compute.inspectable.Inspectable.intervene`, :mod:`.head_mask`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .modes import eval_mode
from .batches import as_analysis_batch
from .head_mask import head_mask_from, mask_heads  # noqa: F401  (their names here since they began here)
from .inspectable import inspectable, require

__all__ = ["mask_heads", "head_mask_from", "head_importance", "head_gradients", "importance_from", "default_loss",
           "forward_batch", "language_model_loss"]

LossFn = Callable[[Any, Any], Tensor]


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


def language_model_loss(output: Any, batch: Any, *, shift: bool = True) -> Tensor:
    """Mean cross-entropy of a language model's logits ``[B, T, V]`` against the batch's own
    ids over real tokens: position ``t`` predicts id ``t + 1`` (``shift``, a decoder), or id
    ``t`` (an encoder-decoder whose decoder read the ids shifted right)."""
    batch = as_analysis_batch(batch)
    logits = getattr(output, "logits", None)
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise ValueError("a language model's loss needs [B, T, V] logits")
    ids, real = batch.input_ids.to(logits.device), batch.mask.to(logits.device)
    if shift:
        logits, ids, real = logits[:, :-1], ids[:, 1:], real[:, 1:]
    return F.cross_entropy(logits[real].float(), ids[real])


def _default_loss_for(kind: str) -> LossFn:
    """Head importance's default loss: a classifier's cross-entropy against its labels, a
    language model's against the text itself (Michel et al. scored translation models so)."""
    if kind == "decoder":
        return language_model_loss
    if kind == "encoder-decoder":
        return lambda output, batch: language_model_loss(output, batch, shift=False)
    return default_loss


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
        loss_fn: ``loss_fn(output, batch) -> scalar``; default cross-entropy of a
            classifier's logits against the batch's labels, or of a language model's
            logits against the text itself (:func:`language_model_loss`).
        pad_id: padding id, when batches carry no mask.
        normalize: divide each layer's scores by their L2 norm (Michel et al., Sec. 4.2).

    Returns:
        ``[L, H]`` float tensor.
    """
    view = inspectable(model)
    require(view, "intervene", "head importance")
    loss_fn = loss_fn or _default_loss_for(view.kind)
    total, batches = None, 0
    with eval_mode(model):
        for batch in dataloader:
            gradient = head_gradients(view, batch, loss_fn=loss_fn, pad_id=pad_id)
            total = gradient if total is None else total + gradient
            batches += 1
    if batches == 0:
        raise ValueError("dataloader yielded no batch")
    return importance_from(total, batches, normalize=normalize)


def head_gradients(view: Any, batch: Any, *, loss_fn: Optional[LossFn] = None, pad_id: Optional[int] = None) -> Tensor:
    """``|dLoss/d xi|`` ``[L, H]`` (float64) of one batch at the all-ones head mask ``xi``
    (the model in eval mode is the caller's; ``loss_fn`` as in :func:`head_importance`)."""
    loss_fn = loss_fn or _default_loss_for(view.kind)
    counts = [site.heads for site in view.attention_sites()]
    model = getattr(view, "model", view)
    dtype = next((p.dtype for p in model.parameters() if p.dtype.is_floating_point), torch.float32)
    xi = torch.ones(len(counts), max(counts), dtype=dtype, requires_grad=True)
    with view.intervene(head_mask=xi):
        loss = loss_fn(forward_batch(view, batch, pad_id), batch)
    (gradient,) = torch.autograd.grad(loss, xi)
    return gradient.abs().double()


def importance_from(total: Tensor, batches: int, *, normalize: bool = False) -> Tensor:
    """Head importance from the summed :func:`head_gradients` of ``batches`` batches (of one
    process, or several added)."""
    importance = total / batches
    if normalize:
        importance = importance / importance.norm(dim=-1, keepdim=True).clamp_min(1e-20)
    return importance.float()
