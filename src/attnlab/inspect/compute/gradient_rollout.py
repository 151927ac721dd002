"""Gradient-weighted attention, propagated through the layers (Chefer, Gur & Wolf, 2021).

Dimension letters: ``L`` layers, ``B`` batch, ``H`` heads, ``T`` length.

Two rules share one propagation. With ``A_l`` a layer's ``[B, H, T, T]`` attention and
``G_l = d y_c / d A_l`` the gradient of the explained class logit, a map ``M_l`` is
weighted by the gradient, ``Abar_l = mean_h (G_l * M_l)^+``, where:

* ``"grad-attention"`` — *Generic Attention-model Explainability* (ICCV 2021):
  ``M_l = A_l``.
* ``"relevance"`` — *Transformer Interpretability Beyond Attention Visualization*
  (CVPR 2021): ``M_l = R_l``, the relevance of the attention map that layer-wise
  relevance propagation from the class logit gives
  (:func:`~attnlab.inspect.compute.lrp.attention_relevance`).

Then ``R = I`` and, from layer 1 up, ``R <- R + Abar_l R`` (the residual keeps the
identity), and a token's score is the pooled query's row of ``R``. Every layer counts,
as the paper's rule reads (their BERT script's ``generate_LRP`` starts at the last layer
by default, ``start_layer=11`` of 12), and the pooled token's own score is kept (their
script zeroes ``[CLS]``'s for display).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .attribution_target import logits_of, resolve_target
from .capture import capture_attention

__all__ = ["AttentionGradients", "attention_gradients", "gradient_weighted_rollout"]


@dataclass
class AttentionGradients:
    """Attention weights and the gradient of the explained logit with respect to them.

    Attributes:
        attentions: per layer ``[B, H, T, T]`` (detached).
        gradients: per layer ``[B, H, T, T]``, ``d logits[b, target[b]] / d A``.
        logits: ``[B, C]`` (detached).
        target: ``[B]`` explained class.
    """

    attentions: list[Tensor]
    gradients: list[Tensor]
    logits: Tensor
    target: Tensor


def attention_gradients(
    model: nn.Module,
    input_ids: Tensor,
    mask: Optional[Tensor] = None,
    target: Optional[Union[int, str]] = None,
) -> AttentionGradients:
    """Run ``model`` once and differentiate the target logit with respect to every attention map.

    Args:
        model: a classifier built on attnlab attention (run in eval mode; modes restored).
        input_ids: ``[B, T]``.
        mask: ``[B, T]``, ``True`` on real tokens.
        target: class index, label name, or ``None`` for each example's prediction.

    Returns:
        :class:`AttentionGradients`.
    """
    with torch.enable_grad(), capture_attention(model, detach=False) as captured:
        output = model(input_ids) if mask is None else model(input_ids, mask=mask)
        logits = logits_of(output)
        classes = resolve_target(logits, target, getattr(model, "label_names", None))
        names = list(captured.paths)
        weights = [captured.attentions[name] for name in names]
        chosen = logits.gather(1, classes[:, None]).sum()  # examples are independent
        gradients = torch.autograd.grad(chosen, weights, allow_unused=True)
    missing = [name for name, gradient in zip(names, gradients) if gradient is None]
    if missing:
        raise ValueError(
            f"the attention weights of {', '.join(missing)} do not feed the model's output here "
            f"(padding skipped or a head mask applied?); explain one unpadded text at a time"
        )
    return AttentionGradients(
        [w.detach() for w in weights], [g.detach() for g in gradients], logits.detach(), classes
    )


def gradient_weighted_rollout(
    maps: Sequence[Tensor],
    gradients: Sequence[Tensor],
    query_weights: Tensor,
) -> Tensor:
    """Chefer et al.'s propagation of gradient-weighted maps; the pooled row.

    Args:
        maps: per layer ``[B, H, T, T]``: the attention weights (``grad-attention``) or
            their LRP relevance (``relevance``); see the module docstring.
        gradients: per layer ``[B, H, T, T]``, the logit's gradient with respect to each
            attention map.
        query_weights: ``[B, T]`` weight of each query row in the pooled position.

    Returns:
        ``[B, T]`` scores.

    Example:
        >>> found = attention_gradients(model, ids)
        >>> gradient_weighted_rollout(found.attentions, found.gradients, torch.tensor([[1.0, 0, 0, 0]]))
    """
    if len(maps) != len(gradients) or not maps:
        raise ValueError(
            f"need one gradient per attention layer, got {len(maps)} maps and {len(gradients)} gradients"
        )
    B, H, T, _ = maps[0].shape
    relevance = torch.eye(T, dtype=torch.float64, device=maps[0].device).expand(B, T, T)  # [B, T, T]
    for weighted, gradient in zip(maps, gradients):
        if weighted.shape != gradient.shape or weighted.shape != (B, H, T, T):
            raise ValueError(
                f"map and gradient must both be [B, H, T, T] = {(B, H, T, T)}, "
                f"got {tuple(weighted.shape)} and {tuple(gradient.shape)}"
            )
        mixed = (gradient.double() * weighted.double()).clamp_min(0).mean(1)  # [B, T, T]
        relevance = relevance + mixed @ relevance
    return torch.einsum("bt,bts->bs", query_weights.double(), relevance).float()  # [B, T]
