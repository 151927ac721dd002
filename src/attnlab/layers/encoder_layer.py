"""One Transformer encoder layer: self-attention and a feed-forward net, each with a
residual and a norm. The whole encoder (embeddings, a stack of these layers, a final
norm) is :class:`attnlab.models.encoder.TransformerEncoder`.

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``H`` heads.
Masks follow :mod:`attnlab.attention.masks`: ``True`` / 1 = may attend, in any dtype.
PyTorch's ``src_mask`` / ``src_key_padding_mask`` keep PyTorch's meaning.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Union

from torch import Tensor, nn

from .._checks import check_positive_int, check_probability
from ..attention.masks import combine_masks, from_torch_mask, keep_mask
from ..attention.multihead import MultiHeadAttention
from ..attention.packing import TokenPacking
from ..attention.sparse import SparseAttention
from .dropout import Dropout
from .encoder_config import EncoderConfig
from .ffn import PositionWiseFFN

__all__ = ["TransformerEncoderLayer", "EncoderLayerOutput", "build_self_attention"]


class EncoderLayerOutput(NamedTuple):
    """``(output [B, T, E], weights [B, H, T, T] | None)``."""

    output: Tensor
    weights: Optional[Tensor]


class TransformerEncoderLayer(nn.Module):
    """Self-attention and a feed-forward net, each with a residual and LayerNorm.

    Post-norm by default, as in the article and BERT:
    ``x = norm1(x + drop(attn(x))); x = norm2(x + ffn(x))``.
    With ``norm_first=True``: ``x = x + drop(attn(norm1(x))); x = x + ffn(norm2(x))``.

    Args:
        d_model: model width ``E``.
        num_heads: attention heads ``H``.
        d_ff: feed-forward hidden width.
        dropout: dropout on the residual branches and inside the feed-forward net.
        attention_dropout: dropout on attention probabilities. 0 by default, unlike
            the article: any value above 0 makes torch leave its fused attention
            kernel in training (slower, ``[B, H, T, T]`` memory). ``None`` = ``dropout``,
            the article's behaviour.
        norm_first: pre-norm instead of post-norm.
        activation: feed-forward activation name or callable.
        layer_norm_eps: LayerNorm epsilon.
        rotary: rotary position embedding inside the attention.
        self_attention: a ready attention module to use instead of
            :class:`MultiHeadAttention` (same call signature), e.g. sparse attention.
        ffn: a ready feed-forward module ``[..., E] -> [..., E]`` instead of
            :class:`PositionWiseFFN` (e.g. a gated one).
        norm_layer: builds the two norms from the width (default ``nn.LayerNorm`` with
            ``layer_norm_eps``), e.g. a LayerNorm without bias.

    Shape:
        ``x`` ``[B, T, E]``; ``mask`` broadcastable to ``[B, H, T, T]`` (e.g.
        ``[B, 1, 1, T]`` for padding; ``True`` / 1 = may attend) or ``attention_mask``
        ``[B, T]``; ``torch.nn``'s ``src_mask`` and ``src_key_padding_mask`` are read as
        ``torch.nn`` reads them -> ``(output [B, T, E], weights [B, H, T, T] | None)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        *,
        attention_dropout: Optional[float] = 0.0,
        norm_first: bool = False,
        activation: Union[str, Callable[[Tensor], Tensor]] = "gelu",
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
        rotary: bool = False,
        self_attention: Optional[nn.Module] = None,
        ffn: Optional[nn.Module] = None,
        norm_layer: Optional[Callable[[int], nn.Module]] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        dropout = check_probability("dropout", dropout)
        factory = {"device": device, "dtype": dtype}
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.norm_first = norm_first
        self.self_attn = self_attention or MultiHeadAttention(
            d_model, num_heads, attention_dropout, bias=bias, rotary=rotary, **factory
        )
        self.ffn = ffn or PositionWiseFFN(d_model, d_ff, dropout, activation=activation, bias=bias, **factory)
        if norm_layer is None:
            norm_layer = lambda width: nn.LayerNorm(width, eps=layer_norm_eps, **factory)  # noqa: E731
        self.norm1 = norm_layer(d_model)
        self.norm2 = norm_layer(d_model)
        self.dropout1 = Dropout(dropout)

    def _attend(
        self, x: Tensor, mask: Optional[Tensor], need_weights: bool, head_mask: Optional[Tensor], extra: dict
    ) -> tuple[Tensor, Optional[Tensor]]:
        out, weights = self.self_attn(x, x, x, mask, need_weights=need_weights, head_mask=head_mask, **extra)
        return self.dropout1(out), weights

    def forward(
        self,
        x: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        attn_bias: Optional[Tensor] = None,
        src_mask: Optional[Tensor] = None,
        src_key_padding_mask: Optional[Tensor] = None,
        is_causal: bool = False,
        need_weights: bool = False,
        head_mask: Optional[Tensor] = None,
        packing: Optional[TokenPacking] = None,
    ) -> EncoderLayerOutput:
        """One layer.

        Args:
            x: ``[B, T, E]``; with ``packing`` (dense attention only) ``x`` and the output
                are the packed ``[N, E]`` real tokens (see :mod:`attnlab.attention.packing`),
                the packing keeps padding keys out and ``mask`` may only add constraints.
            mask: keep mask broadcastable to ``[B, H, T, T]`` (``True`` / 1 = may attend).
            attention_mask: ``[B, T]``, ``True`` / 1 on real tokens (HuggingFace's).
            attn_bias: additive float term broadcastable to ``[B, H, T, T]``.
            src_mask: ``torch.nn.TransformerEncoderLayer``'s: ``[T, T]`` or
                ``[B * H, T, T]``, bool ``True`` = may *not* attend, float additive.
            src_key_padding_mask: ``torch.nn``'s: ``[B, T]``, bool ``True`` on padding.
            is_causal: also forbid attending to later positions.
        """
        extra: dict = {} if packing is None else {"packing": packing}
        if src_key_padding_mask is not None and src_key_padding_mask.dim() != 2:
            raise ValueError(
                f"src_key_padding_mask must be [B, T] (torch.nn's padding mask), "
                f"got {tuple(src_key_padding_mask.shape)}"
            )
        padding_keep, padding_bias = from_torch_mask(
            src_key_padding_mask, name="src_key_padding_mask", padding=False
        )  # [B, T]: a padding mask stays [B, T], which every attention module takes
        if padding_bias is not None:
            padding_bias = padding_bias[:, None, None, :]  # [B, 1, 1, T]
            attn_bias = padding_bias if attn_bias is None else attn_bias + padding_bias
        if attention_mask is not None:
            attention_mask = keep_mask(attention_mask, name="attention_mask", bias_argument="attn_bias")
        if attention_mask is not None and padding_keep is not None and attention_mask.dim() != 2:
            padding_keep = padding_keep[:, None, None, :]  # [B, 1, 1, T], to meet a rank-4 mask
        attention_mask = combine_masks(attention_mask, padding_keep)
        given = {"attention_mask": attention_mask, "attn_bias": attn_bias, "attn_mask": src_mask}
        extra.update({name: value for name, value in given.items() if value is not None})
        if is_causal:
            extra["is_causal"] = True
        if self.norm_first:
            attended, weights = self._attend(self.norm1(x), mask, need_weights, head_mask, extra)
            x = x + attended
            x = x + self.ffn(self.norm2(x))
        else:
            attended, weights = self._attend(x, mask, need_weights, head_mask, extra)
            x = self.norm1(x + attended)
            x = self.norm2(x + self.ffn(x))
        return EncoderLayerOutput(x, weights)


def build_self_attention(config: EncoderConfig, *, device=None, dtype=None) -> Optional[nn.Module]:
    """The attention module a layer should use, or ``None`` for the default dense one."""
    if config.attention == "sparse":
        return SparseAttention(
            config.d_model,
            config.num_heads,
            config.block_size,
            config.effective_attention_dropout,
            window=config.window,
            global_summary=config.global_summary,
            global_tokens=config.global_tokens,
            bias=config.bias,
            rotary=config.position == "rotary",
            device=device,
            dtype=dtype,
        )
    return None
