"""Statistics that fit causal attention, per layer and head.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query rows, ``S`` keys.

A decoder's query at position ``t`` may attend only to the real keys at or before ``t``,
so a statistic that divides by the number of real keys of the whole sequence (as the
encoder statistics do) mixes up position and spread. Over each real query row ``p``,
with ``n_t`` the real keys it may attend (its allowed prefix):

* ``normalized_entropy``: ``-sum_s p_s log p_s / log n_t`` in ``[0, 1]`` (1 = uniform over
  the prefix); rows with ``n_t = 1`` (the first token) are left out.
* ``sink_mass``: the mass on the first real token, the "attention sink" of Xiao et al.
  (2023); rows with ``n_t = 1`` are left out (all their mass is there by force).
* ``mean_distance``: ``sum_s p_s (t - s)``, how far back the row looks, in real tokens.

Values are means over rows, in float64.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import Tensor

__all__ = ["CAUSAL_STATISTICS", "causal_statistics"]

CAUSAL_STATISTICS = ("normalized_entropy", "sink_mass", "mean_distance")


def _layer_statistics(weights: Tensor, keep: Tensor) -> dict[str, Tensor]:
    B, H, T, S = weights.shape
    p = weights.double() * keep[:, None, None, :]  # [B, H, T, S], padding keys dropped
    real_before = keep.long().cumsum(-1)  # [B, S] real tokens up to and including s
    rank = real_before - 1  # [B, S] index of a real token among the real ones
    query_rank = rank[:, S - T:]  # [B, T]
    prefix = real_before[:, S - T:].double()  # [B, T] n_t
    rows = keep[:, S - T:] & (prefix > 1)  # [B, T] real queries with a choice
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [B, H, T]
    normalized = entropy / prefix.clamp_min(2).log()[:, None]
    first = (keep & (rank == 0)).double()  # [B, S] the first real token
    sink = (p * first[:, None, None, :]).sum(-1)  # [B, H, T]
    distance = (p * (query_rank[:, None, :, None] - rank[:, None, None, :]).double()).sum(-1)  # [B, H, T]
    weight = rows[:, None, :].double()  # [B, 1, T]
    count = weight.sum((0, 2)).clamp_min(1)  # [1] -> broadcast over heads
    return {name: (value * weight).sum((0, 2)) / count
            for name, value in (("normalized_entropy", normalized), ("sink_mass", sink),
                                ("mean_distance", distance))}


def causal_statistics(
    attentions: Mapping[str, Tensor], attention_mask: Optional[Tensor] = None
) -> dict[str, dict[str, list[float]]]:
    """``{statistic: {layer name: [one value per head]}}`` of a decoder's weights.

    Args:
        attentions: ``{"layer_1": [B, H, T, S], ...}`` (a
            :class:`~attnlab.outputs.LayerAttentions` works), the ``T`` rows being the
            last ``T`` of the ``S`` positions.
        attention_mask: ``[B, S]`` keep mask, ``True`` / 1 on real tokens (left padding);
            ``None`` = all real.

    Example:
        >>> out = model(ids, output_attentions=True)
        >>> causal_statistics(out.attentions)["sink_mass"]["layer_1"]
        [0.61, 0.08, ...]
    """
    items = list(attentions.items())
    if not items:
        raise ValueError("attentions is empty: pass {layer name: [B, H, T, S] weights}")
    B, _, _, S = items[0][1].shape
    if attention_mask is None:
        keep = torch.ones(B, S, dtype=torch.bool, device=items[0][1].device)
    else:
        if tuple(attention_mask.shape) != (B, S):
            raise ValueError(f"attention_mask must be [B, S] = [{B}, {S}], got {tuple(attention_mask.shape)}")
        keep = attention_mask.bool()
    result: dict[str, dict[str, list[float]]] = {name: {} for name in CAUSAL_STATISTICS}
    for layer, weights in items:
        if weights.dim() != 4 or weights.shape[-1] != S or weights.shape[0] != B:
            raise ValueError(f"{layer}: weights must be [B, H, T, S] = [{B}, H, T, {S}], got {tuple(weights.shape)}")
        for name, values in _layer_statistics(weights, keep).items():
            result[name][layer] = values.tolist()
    return result
