"""One pre-norm decoder block: ``x + attn(norm(x))``, then ``x + ffn(norm(x))``.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` new positions, ``S`` all positions,
``E`` model dim.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from .causal_attention import CausalSelfAttention
from .decoder_config import DecoderConfig
from .ffn import PositionWiseFFN
from .ffn import SwiGLUFFN
from .kv_cache import KVCache
from .rms_norm import RMSNorm

__all__ = ["DecoderLayer", "build_decoder_layer", "build_norm"]


class DecoderLayer(nn.Module):
    """A pre-norm block, as GPT-2 and the Llama family use: components come in built.

    Args:
        self_attn: a :class:`~attnlab.layers.causal_attention.CausalSelfAttention`.
        feed_forward: any ``[.., E] -> [.., E]`` module (SwiGLU, plain FFN).
        attn_norm: the norm before attention.
        ffn_norm: the norm before the feed-forward net.

    Shape:
        ``x`` ``[B, T, E]`` -> ``(x [B, T, E], weights [B, H, T, S] or None)``.
    """

    def __init__(self, self_attn: CausalSelfAttention, feed_forward: nn.Module, attn_norm: nn.Module,
                 ffn_norm: nn.Module) -> None:
        super().__init__()
        self.attn_norm = attn_norm
        self.self_attn = self_attn
        self.ffn_norm = ffn_norm
        self.feed_forward = feed_forward

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
    ) -> tuple[Tensor, Optional[Tensor]]:
        attended, weights = self.self_attn(
            self.attn_norm(x), rotary=rotary, mask=mask, is_causal=is_causal, cache=cache,
            layer_index=layer_index, need_weights=need_weights,
        )
        x = x + attended
        x = x + self.feed_forward(self.ffn_norm(x))
        return x, weights


def build_norm(config: DecoderConfig, *, device=None, dtype=None) -> nn.Module:
    """The config's norm at width ``E``: :class:`RMSNorm` or ``nn.LayerNorm``."""
    if config.norm == "rms":
        return RMSNorm(config.d_model, config.norm_eps, device=device, dtype=dtype)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, device=device, dtype=dtype)


def build_decoder_layer(config: DecoderConfig, index: int, *, device=None, dtype=None) -> DecoderLayer:
    """Layer ``index`` (0-based) of the decoder ``config`` describes."""
    factory = {"device": device, "dtype": dtype}
    scale = config.attention_head_dim ** -0.5
    if config.scale_by_layer:
        scale = scale / (index + 1)
    attention = CausalSelfAttention(
        config.d_model, config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        qkv_bias=config.qkv_bias, out_bias=config.out_bias, scale=scale, **factory,
    )
    if config.feed_forward == "gated":
        feed_forward: nn.Module = SwiGLUFFN(config.d_model, config.d_ff, activation=config.activation,
                                           bias=config.ffn_bias, **factory)
    else:
        feed_forward = PositionWiseFFN(config.d_model, config.d_ff, 0.0, activation=config.activation,
                                       bias=config.ffn_bias, **factory)
    return DecoderLayer(attention, feed_forward, build_norm(config, **factory), build_norm(config, **factory))
