"""Attention rollout across layers (Abnar & Zuidema, 2020, "Quantifying Attention Flow").

Dimension letters: ``L`` layers, ``B`` batch, ``H`` heads, ``T`` length.

Each layer's attention is averaged over heads, mixed with the identity for the residual
connection, ``A'_l = w * A_l + (1 - w) * I``, renormalised per row, and the layers are
multiplied from the bottom up: ``R_l = A'_l A'_{l-1} ... A'_1``. ``R_l[t, s]`` is how
much of token ``s``'s input reaches position ``t`` after layer ``l``.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["attention_rollout"]


def attention_rollout(
    attentions: Union[Sequence[Tensor], Mapping[str, Tensor]],
    mask: Optional[Tensor] = None,
    *,
    residual_weight: float = 0.5,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> Tensor:
    """Cumulative attention rollout after every layer.

    Args:
        attentions: per layer ``[B, H, T, T]`` (a list, or the ``{"layer_1": ...}`` dict
            a model or :func:`capture_attention` returns, taken in its order).
        mask: ``[B, T]`` bool, ``True`` on real tokens; padded keys get no flow and padded
            rows keep only their identity.
        residual_weight: ``w`` above, the share of the attention against the residual
            (0.5 in the paper).
        head_fusion: how heads are merged: ``"mean"``, ``"max"`` or ``"min"``.
        discard_ratio: share of each layer's fused weights set to zero before the residual
            is mixed in, the smallest first (vit-explain's filter): ``int(T * T * ratio)``
            cells, except cell ``[0, 0]`` (the class token's weight on itself), which is
            never dropped. vit-explain then divides ``a / a.sum(-1)`` without ``keepdim``,
            which scales columns; here rows are renormalised, as the paper does.

    Returns:
        ``[L, B, T, T]``: the rollout after layer 1, 2, ..., L.

    Shape:
        each attention ``[B, H, T, T]``; ``mask`` ``[B, T]``.
    """
    layers = list(attentions.values()) if isinstance(attentions, Mapping) else list(attentions)
    if not layers:
        raise ValueError("attentions is empty; expected one [B, H, T, T] tensor per layer")
    if not 0.0 <= residual_weight <= 1.0:
        raise ValueError(f"residual_weight must lie in [0, 1], got {residual_weight!r}")
    fusions = {"mean": lambda a: a.mean(1), "max": lambda a: a.amax(1), "min": lambda a: a.amin(1)}
    if head_fusion not in fusions:
        raise ValueError(f"head_fusion must be one of {sorted(fusions)}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must lie in [0, 1), got {discard_ratio!r}")
    B, H, T, S = layers[0].shape
    if T != S:
        raise ValueError(f"rollout needs self-attention maps [B, H, T, T], got {tuple(layers[0].shape)}")
    eye = torch.eye(T, dtype=torch.float32, device=layers[0].device)  # [T, T]
    keep = None if mask is None else mask.bool()[:, None, :].float()  # [B, 1, T]
    rollout = eye.expand(B, T, T)
    result = []
    for weights in layers:
        if weights.shape != (B, H, T, T):
            raise ValueError(f"every layer must be [B, H, T, T] = {(B, H, T, T)}, got {tuple(weights.shape)}")
        mixed = fusions[head_fusion](weights.float())  # [B, T, T]
        dropped = int(T * T * discard_ratio)
        if dropped:
            flat = mixed.reshape(B, T * T).clone()  # [B, T * T]
            smallest = flat.topk(dropped, dim=-1, largest=False).indices  # [B, dropped]
            keep_first = smallest != 0  # the class token's weight on itself stays
            flat.scatter_(1, smallest, flat.gather(1, smallest) * ~keep_first)
            mixed = flat.reshape(B, T, T)
        if keep is not None:
            mixed = mixed * keep * keep.transpose(1, 2)  # padded rows and keys carry nothing
        mixed = residual_weight * mixed + (1.0 - residual_weight) * eye
        mixed = mixed / mixed.sum(-1, keepdim=True).clamp_min(1e-12)
        rollout = mixed @ rollout  # [B, T, T]
        result.append(rollout)
    return torch.stack(result)  # [L, B, T, T]
