"""Per-token scores read from attention weights alone: raw attention and rollout.

Dimension letters: ``L`` layers, ``B`` batch, ``H`` heads, ``T`` length.

``raw``: the pooled position's row of the last layer's attention, mean over heads
(a ``[CLS]`` model: row 0; a mean-pooling model: the mean of the real rows).
``rollout``: the same row of Abnar & Zuidema's attention rollout after the last layer
(:func:`~attnlab.inspect.compute.rollout.attention_rollout`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from .rollout import attention_rollout

__all__ = ["raw_attention_scores", "rollout_scores", "as_layer_list"]

Attentions = Union[Sequence[Tensor], Mapping[str, Tensor]]


def as_layer_list(attentions: Attentions) -> list[Tensor]:
    """Per-layer ``[B, H, T, T]`` tensors from a list or a ``{"layer_1": ...}`` mapping."""
    layers = list(attentions.values()) if isinstance(attentions, Mapping) else list(attentions)
    if not layers:
        raise ValueError("attentions is empty; expected one [B, H, T, T] tensor per layer")
    for index, weights in enumerate(layers):
        if not isinstance(weights, Tensor) or weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
            got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
            raise ValueError(f"layer_{index + 1} must be self-attention [B, H, T, T], got {got}")
    return layers


def _check_query_weights(query_weights: Tensor, B: int, T: int) -> Tensor:
    if query_weights.shape != (B, T):
        raise ValueError(f"query_weights must be [B, T] = [{B}, {T}], got {tuple(query_weights.shape)}")
    return query_weights.float()


def raw_attention_scores(attentions: Attentions, query_weights: Tensor) -> Tensor:
    """The pooled row of the last layer's attention, averaged over heads.

    Args:
        attentions: per layer ``[B, H, T, T]``.
        query_weights: ``[B, T]`` weight of each query row (see
            :func:`~attnlab.inspect.compute.attribution_target.query_weights`).

    Returns:
        ``[B, T]``: one score per key token.
    """
    last = as_layer_list(attentions)[-1].float()
    B, H, T, _ = last.shape
    weights = _check_query_weights(query_weights, B, T)
    return torch.einsum("bt,bts->bs", weights, last.mean(1))  # [B, T]


def rollout_scores(
    attentions: Attentions,
    query_weights: Tensor,
    mask: Optional[Tensor] = None,
    *,
    residual_weight: float = 0.5,
) -> Tensor:
    """The pooled row of the attention rollout after the last layer.

    Args:
        attentions: per layer ``[B, H, T, T]``.
        query_weights: ``[B, T]`` weight of each query row.
        mask: ``[B, T]`` bool, ``True`` on real tokens.
        residual_weight: the attention's share against the residual (0.5 in the paper).

    Returns:
        ``[B, T]``.
    """
    layers = as_layer_list(attentions)
    B, _, T, _ = layers[0].shape
    weights = _check_query_weights(query_weights, B, T)
    rollout = attention_rollout(layers, mask, residual_weight=residual_weight)[-1]  # [B, T, T]
    return torch.einsum("bt,bts->bs", weights, rollout)  # [B, T]
