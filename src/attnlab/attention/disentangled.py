"""DeBERTa's disentangled attention: content-to-position and position-to-content scores.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``D`` head dim, ``E`` model dim, ``R`` rows of the relative-position table (``2 * span``).

Besides ``q_i . k_j``, each score gets ``q_i . pk[d(i, j)]`` (content to position) and
``k_j . pq[d(j, i)]`` (position to content), where ``pk``/``pq`` are the layer's key and
query projections of a table of relative-position embeddings shared by every layer and
``d`` is the bucketed relative distance; the sum is scaled by ``1 / sqrt(D * (1 + n))``
for ``n`` position terms. The extra terms are an ``attn_bias`` for the kernel, so the
fused path (no weights) and the reference path (weights) both serve it.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from .._precision import Linear, linear
from .functional import AttentionResult
from .interface import attend
from .multihead import MultiHeadAttention

__all__ = ["DisentangledSelfAttention", "RelativePositionTable", "log_bucket_position"]

POSITION_TERMS = ("c2p", "p2c")


def log_bucket_position(relative: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa's buckets: exact within ``bucket_size / 2``, logarithmic beyond, odd in the offset."""
    sign = torch.sign(relative)
    mid = bucket_size // 2
    near = (relative < mid) & (relative > -mid)
    distance = torch.where(near, torch.tensor(mid - 1).type_as(relative), relative.abs())
    log_position = (
        torch.ceil(torch.log(distance / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1))
        + mid
    )
    return torch.where(distance <= mid, relative.type_as(log_position), log_position * sign).long()


class RelativePositionTable(nn.Module):
    """The relative-position embeddings every layer projects (with an optional LayerNorm).

    Args:
        span: relative distances ``-span .. span - 1`` have rows (``R = 2 * span``).
        d_model: ``E``.
        norm_eps: a LayerNorm on the table with this epsilon (``None``: none).
        bucket_size: DeBERTa's ``position_buckets`` (``<= 0``: no buckets).
        max_position: DeBERTa's ``max_relative_positions``.
    """

    def __init__(
        self,
        span: int,
        d_model: int,
        *,
        norm_eps: Optional[float] = None,
        bucket_size: int = -1,
        max_position: int = -1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.span, self.bucket_size, self.max_position = span, bucket_size, max_position
        self.embedding = nn.Embedding(2 * span, d_model, device=device, dtype=dtype)
        self.norm = (
            None if norm_eps is None else nn.LayerNorm(d_model, eps=norm_eps, device=device, dtype=dtype)
        )

    def table(self, rows: Optional[slice] = None) -> Tensor:
        """``[R, E]``, or the ``rows`` asked for (the norm works row by row)."""
        weight = self.embedding.weight if rows is None else self.embedding.weight[rows]
        return weight if self.norm is None else self.norm(weight)

    def offsets(self, query_len: int, key_len: int, device) -> Tensor:
        """``[T, S]`` bucketed ``i - j``."""
        relative = (
            torch.arange(query_len, device=device)[:, None] - torch.arange(key_len, device=device)[None, :]
        )
        if self.bucket_size > 0 and self.max_position > 0:
            relative = log_bucket_position(relative, self.bucket_size, self.max_position)
        return relative


class DisentangledSelfAttention(MultiHeadAttention):
    """:class:`MultiHeadAttention` with DeBERTa's disentangled position terms.

    Args:
        d_model: ``E``.
        num_heads: ``H``.
        dropout: attention-probability dropout.
        positions: the :class:`RelativePositionTable` all layers share; the first layer
            registers it (``owns_positions=True``), the others only refer to it, so it is
            stored once.
        terms: which position terms to add, among ``"c2p"`` and ``"p2c"``.
        share_projections: project the table with the layer's own query and key
            projections (DeBERTa-v3) instead of separate ``pos_query_proj``/``pos_key_proj``.

    Shape:
        as :class:`MultiHeadAttention` (self-attention only).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        *,
        positions: RelativePositionTable,
        owns_positions: bool,
        terms: tuple[str, ...] = POSITION_TERMS,
        share_projections: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(d_model, num_heads, dropout, device=device, dtype=dtype)
        unknown = sorted(set(terms) - set(POSITION_TERMS))
        if unknown:
            raise ValueError(f"terms must be among {POSITION_TERMS}, got {unknown}")
        self.terms = tuple(terms)
        self.share_projections = share_projections
        if owns_positions:
            self.positions = positions
        else:
            self._shared = (positions,)  # a tuple: a reference, not a submodule, so it is stored once
        factory = {"device": device, "dtype": dtype}
        if not share_projections:
            self.pos_key_proj = Linear(d_model, d_model, **factory) if "c2p" in terms else None
            self.pos_query_proj = Linear(d_model, d_model, **factory) if "p2c" in terms else None

    _attends_by_sequence = False  # the position terms need the padded layout

    def supports_packing(self) -> bool:
        return True

    @property
    def table(self) -> RelativePositionTable:
        return self.positions if "positions" in self._modules else self._shared[0]

    def _projected_table(self, which: str, rows: Optional[slice] = None) -> Tensor:
        """The table (or its ``rows``) through the query (``"q"``) or key (``"k"``)
        projection: ``[H, R, D]``."""
        table = self.table.table(rows)  # [R, E]
        if self.share_projections:
            (w_q, w_k, _), (b_q, b_k, _) = self._weights(), self._biases()
            projected = linear(table, w_q, b_q) if which == "q" else linear(table, w_k, b_k)
        else:
            projected = (self.pos_query_proj if which == "q" else self.pos_key_proj)(table)
        return projected.view(table.shape[0], self.num_heads, self.head_dim).transpose(0, 1)  # [H, R, D]

    def _position_scores(self, q: Tensor, k: Tensor) -> Tensor:
        """The unscaled position terms ``[B, H, T, S]``.

        Only the table rows of distances that occur in a ``T x S`` block are projected and
        scored (``2T - 1`` of them for short inputs, where DeBERTa's table has 512): the
        same numbers for a fraction of the work.
        """
        B, H, T, _ = q.shape
        S = k.shape[2]
        span = self.table.span
        rows = 2 * span
        by_query = (self.table.offsets(T, S, q.device) + span).clamp(0, rows - 1)  # [T, S]: i - j
        by_key = (span - self.table.offsets(S, T, q.device)).clamp(0, rows - 1)  # [S, T]: -(j - i)
        used = [index for term, index in (("c2p", by_query), ("p2c", by_key)) if term in self.terms]
        low = min(int(index.min()) for index in used) if used else 0
        high = max(int(index.max()) for index in used) if used else 0
        needed = slice(low, high + 1)
        scores = None
        if "c2p" in self.terms:
            c2p = q @ self._projected_table("k", needed).transpose(-1, -2)  # [B, H, T, R']
            scores = c2p.gather(-1, (by_query - low).expand(B, H, T, S))
        if "p2c" in self.terms:
            p2c = k @ self._projected_table("q", needed).transpose(-1, -2)  # [B, H, S, R']
            p2c = p2c.gather(-1, (by_key - low).expand(B, H, S, T)).transpose(-1, -2)
            scores = p2c if scores is None else scores + p2c
        return q.new_zeros(B, H, T, S) if scores is None else scores

    def _attention_core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Optional[Tensor],
        attn_bias: Optional[Tensor],
        is_causal: bool,
        need_weights: bool,
        head_mask: Optional[Tensor],
    ) -> AttentionResult:
        scale = 1.0 / math.sqrt(self.head_dim * (1 + len(self.terms)))
        bias = self._position_scores(q, k) * scale  # [B, H, T, S]
        if attn_bias is not None:
            bias = bias + attn_bias
        return attend(self, q, k, v, mask, attn_bias=bias, dropout=self.dropout if self.training else 0.0,
                      is_causal=is_causal, scale=scale, need_weights=need_weights, head_mask=head_mask)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", terms={self.terms}, share_projections={self.share_projections}"
