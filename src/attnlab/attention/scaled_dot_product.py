"""The scaled dot-product attention module: the attention kernel as an ``nn.Module``.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``D`` head dim.

Masks follow attnlab's one contract (:mod:`attnlab.attention.masks`): masks keep
(``True`` / 1 = may attend, any dtype), additive terms come only as ``attn_bias``.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from .._checks import check_probability
from .functional import AttentionResult
from .interface import attend

__all__ = ["ScaledDotProductAttention"]


class ScaledDotProductAttention(nn.Module):
    """``softmax(Q K^T / sqrt(D) + mask) V`` with dropout on the probabilities.

    A thin module over :func:`attnlab.attention.functional.attention`: the fused kernel
    runs unless ``need_weights=True``.

    Args:
        dropout: dropout on the attention probabilities (training only).

    Shape:
        query ``[B, H, T, D]``, key ``[B, H, S, D]``, value ``[B, H, S, Dv]``, mask
        broadcastable to ``[B, H, T, S]`` (``True`` / 1 = may attend, any dtype),
        ``attn_bias`` an additive float term of the same shape
        -> ``(output [B, H, T, Dv], weights [B, H, T, S] or None)``. Weights are
        ``None`` unless ``need_weights=True``; they are the probabilities before dropout.
    """

    # The attention function this module calls (attnlab.attention.interface).
    attn_implementation = "sdpa"

    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = check_probability("dropout", dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attn_bias: Optional[Tensor] = None,
        need_weights: bool = False,
        is_causal: bool = False,
        scale: Optional[float] = None,
    ) -> AttentionResult:
        return attend(self, query, key, value, mask, attn_bias=attn_bias,
                      dropout=self.dropout if self.training else 0.0, is_causal=is_causal, scale=scale,
                      need_weights=need_weights)

    def extra_repr(self) -> str:
        return f"dropout={self.dropout}"
