"""Attention score biases that depend on positions only: relative position buckets.

Dimension letters: ``H`` heads, ``T`` query length, ``S`` key length.

A score bias is a component: a module called with the query and key lengths that
returns an additive ``attn_bias`` ``[1, H, T, S]`` for every layer that shares it
(MPNet computes one bias and adds it to the scores of every layer).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import check_positive_int

__all__ = ["RelativePositionBias", "relative_position_bucket"]


def relative_position_bucket(
    relative_position: Tensor, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5/MPNet bidirectional buckets of ``key - query`` offsets.

    Half of the buckets hold keys before the query, half keys after it; inside each half
    the first ``num_buckets / 4`` distances get one bucket each and the rest share
    logarithmically wider buckets up to ``max_distance``.
    """
    half = num_buckets // 2
    distance = -relative_position
    bucket = (distance < 0).long() * half
    distance = distance.abs()
    exact = half // 2
    is_small = distance < exact
    large = (
        exact + (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    )
    large = torch.clamp(large, max=half - 1)
    return bucket + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """A learned bias per head and relative-position bucket, added to attention scores.

    Args:
        num_heads: ``H``.
        num_embeddings: rows of the bias table (HuggingFace's
            ``relative_attention_num_buckets``).
        num_buckets: buckets the offsets are sorted into (MPNet always uses 32).
        max_distance: offsets beyond this share the last bucket.

    Shape:
        ``forward(T, S)`` -> ``[1, H, T, S]`` float, to pass as ``attn_bias``.
    """

    def __init__(
        self,
        num_heads: int,
        num_embeddings: int = 32,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_heads", num_heads),
            ("num_embeddings", num_embeddings),
            ("num_buckets", num_buckets),
            ("max_distance", max_distance),
        ):
            check_positive_int(name, value)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embedding = nn.Embedding(num_embeddings, num_heads, device=device, dtype=dtype)

    def forward(self, query_len: int, key_len: int) -> Tensor:
        device = self.embedding.weight.device
        query = torch.arange(query_len, device=device)[:, None]  # [T, 1]
        key = torch.arange(key_len, device=device)[None, :]  # [1, S]
        buckets = relative_position_bucket(key - query, self.num_buckets, self.max_distance)  # [T, S]
        return self.embedding(buckets).permute(2, 0, 1).unsqueeze(0)  # [1, H, T, S]

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
