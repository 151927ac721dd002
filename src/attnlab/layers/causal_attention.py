"""Causal self-attention of a decoder: grouped-query heads, rotary positions, a KV cache.

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key/value heads, ``T`` new
positions, ``S`` all positions (cached + new), ``D`` head dim, ``E`` model dim.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from .._checks import check_positive_int
from .._precision import Linear
from ..attention.functional import AttentionResult
from ..attention.interface import attend
from .kv_cache import KVCache
from ..attention.rotary import apply_rotary

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention for decoders, with ``K`` key/value heads shared by groups
    of ``H / K`` query heads (grouped-query attention; ``K = H`` is ordinary multi-head,
    ``K = 1`` multi-query).

    One ``qkv_proj`` computes queries, keys and values (``[H*D | K*D | K*D]`` outputs),
    then rotary angles, when given, rotate queries and keys; a :class:`KVCache`, when
    given, receives the new keys and values and supplies all of them.

    Args:
        d_model: model width ``E``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``K`` (default ``H``); must divide ``H``.
        head_dim: ``D`` (default ``E / H``).
        qkv_bias: biases on the query, key and value projections.
        out_bias: bias on the output projection.
        scale: score scale (default ``1 / sqrt(D)``).

    Shape:
        ``x`` ``[B, T, E]``; ``rotary`` ``(cos, sin)`` each ``[B, T, D]``; ``mask`` a keep
        mask (``True`` / 1 = may attend, any dtype) broadcastable to ``[B, H, T, S]``
        -> ``(output [B, T, E], weights [B, H, T, S] or None)``. Weights only with
        ``need_weights=True``; ``None`` otherwise (the fused kernel runs). ``head_mask``
        ``[H]`` or ``[B, H]`` multiplies each head's output (0 switches a head off).
    """

    # The attention function this module calls (attnlab.attention.interface); grouped
    # key/value heads are passed as they are.
    attn_implementation = "sdpa"

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        num_kv_heads: Optional[int] = None,
        head_dim: Optional[int] = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        scale: Optional[float] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else check_positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}), or give head_dim")
            head_dim = d_model // num_heads
        check_positive_int("head_dim", head_dim)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        factory = {"device": device, "dtype": dtype}
        self.qkv_proj = Linear(d_model, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias, **factory)
        self.o_proj = Linear(num_heads * head_dim, d_model, bias=out_bias, **factory)

    def forward(
        self,
        x: Tensor,
        *,
        rotary: Optional[tuple[Tensor, Tensor]] = None,
        mask: Optional[Tensor] = None,
        is_causal: bool = False,
        cache: Optional[KVCache] = None,
        layer_index: int = 0,
        need_weights: bool = False,
        head_mask: Optional[Tensor] = None,
    ) -> AttentionResult:
        B, T, _ = x.shape
        H, K, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x).view(B, T, H + 2 * K, D).transpose(1, 2)  # [B, H + 2K, T, D]
        query, key, value = qkv.split((H, K, K), dim=1)  # [B, H, T, D], [B, K, T, D] x 2
        if rotary is not None:
            cos, sin = rotary
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        if cache is not None:
            key, value = cache.update(layer_index, key, value)  # [B, K, S, D]
        output, weights = attend(self, query, key, value, mask, is_causal=is_causal, scale=self.scale,
                                 need_weights=need_weights, head_mask=head_mask)  # [B, H, T, D], [B, H, T, S]
        output = output.transpose(1, 2).reshape(B, T, H * D)  # [B, T, H*D]
        return AttentionResult(self.o_proj(output), weights)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
