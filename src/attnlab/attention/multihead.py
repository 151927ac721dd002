"""The multi-head attention module (its single-head kernel module,
:class:`ScaledDotProductAttention`, lives in :mod:`attnlab.attention.scaled_dot_product`).

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``D`` head dim, ``E`` model dim.

Masks follow attnlab's one contract (:mod:`attnlab.attention.masks`): masks keep
(``True`` / 1 = may attend, any dtype), additive terms come only as ``attn_bias``, and
PyTorch's ``attn_mask`` keeps PyTorch's meaning.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_inputs_match, check_positive_int, check_probability
from .._precision import Linear, bf16_is_emulated, linear
from .functional import AttentionResult
from .interface import attend, combined_head_mask, scale_heads
from .masks import (
    combine_masks,
    gather_masks,
    head_mask_scale,
    padding_to_attention_mask,
    refuse_key_padding_mask,
    sliding_window_mask,
)
from .packing import TokenPacking
from .rotary import RotaryEmbedding
from .scaled_dot_product import ScaledDotProductAttention

__all__ = ["ScaledDotProductAttention", "MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention for self- and cross-attention.

    Parameters are laid out like ``torch.nn.MultiheadAttention`` (``in_proj_weight``
    packs Q, K and V when ``kdim == vdim == d_model``; ``out_proj``), so one
    ``state_dict`` loads into the other. Self-attention (``query is key is value``)
    runs a single fused QKV projection.

    Args:
        d_model: model width ``E``; must be divisible by ``num_heads``.
        num_heads: number of heads ``H``.
        dropout: dropout on the attention probabilities (training only). Any value
            above 0 makes torch leave its flash kernel during training.
        kdim: feature size of ``key`` (default ``d_model``).
        vdim: feature size of ``value`` (default ``d_model``).
        bias: add biases to the projections.
        rotary: apply rotary position embedding to queries and keys.
        rotary_base: frequency base of the rotary embedding.
        window: local attention: each query attends only to keys at most ``window``
            positions away on either side (``None``: every key).
        head_dim: width ``D`` of each head; default ``d_model // num_heads``. Given, the
            heads' total width ``H * D`` (``inner_dim``) may differ from ``d_model``, as
            after :meth:`prune_heads`.

    Shape:
        query ``[B, T, E]``, key ``[B, S, kdim]``, value ``[B, S, vdim]``;
        ``mask`` broadcastable to ``[B, H, T, S]`` (``[T, S]``, ``[B, T, S]``,
        ``[B, H, T, S]``, or a ``[B, S]`` padding mask where ``[T, S]`` does not fit;
        ``True`` / 1 = may attend, any dtype);
        ``attention_mask`` ``[B, S]``, ``True`` / 1 on real keys (HuggingFace's);
        ``attn_bias`` an additive float term broadcastable to ``[B, H, T, S]``;
        ``attn_mask`` as ``torch.nn.MultiheadAttention`` takes it (``[T, S]`` or
        ``[B * H, T, S]``; bool ``True`` = may *not* attend, float additive);
        ``key_padding_mask`` is refused (its polarity differs between torch.nn and
        older attnlab; pass ``attention_mask``);
        ``head_mask`` ``[H]`` or ``[B, H]``, multiplies each head's output.
        Returns ``(output [B, T, E], weights)`` where weights are ``[B, H, T, S]``
        (``[B, T, S]`` with ``average_attn_weights=True``) when ``need_weights=True``,
        else ``None``.
        With ``packing`` (a :class:`~attnlab.attention.packing.TokenPacking`, self-attention
        only) the input is the packed ``[N, E]`` real tokens of a padded ``[B, T]`` batch
        and so is the output; the packing itself keeps padding keys out, and ``mask``
        (``[B|1, H|1, T, T]``) may only add constraints. The projections run on the
        ``N`` rows alone; the attention runs sequence by sequence on the real tokens too
        when that is cheaper and neither weights nor an extra mask are asked for, else on
        the padded layout, where the weights of padding queries are zero.

    Example:
        >>> mha = MultiHeadAttention(64, 4, dropout=0.0)
        >>> x = torch.randn(2, 10, 64)
        >>> out, weights = mha(x, x, x, need_weights=True)
        >>> out.shape, weights.shape
        (torch.Size([2, 10, 64]), torch.Size([2, 4, 10, 10]))
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.1,
        *,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        bias: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        window: Optional[int] = None,
        head_dim: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        elif d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                f"choose num_heads among the divisors of d_model"
            )
        factory = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads if head_dim is None else head_dim
        inner = self.inner_dim = num_heads * self.head_dim  # H * D: d_model unless head_dim says otherwise
        self.kdim = d_model if kdim is None else kdim
        self.vdim = d_model if vdim is None else vdim
        self.dropout = check_probability("dropout", dropout)
        self.packed = self.kdim == d_model and self.vdim == d_model
        if self.packed:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * inner, d_model, **factory))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(inner, d_model, **factory))
            self.k_proj_weight = nn.Parameter(torch.empty(inner, self.kdim, **factory))
            self.v_proj_weight = nn.Parameter(torch.empty(inner, self.vdim, **factory))
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * inner, **factory))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(inner, d_model, bias=bias, **factory)
        self.rotary = RotaryEmbedding(self.head_dim, rotary_base, device=device) if rotary else None
        if window is not None:
            sliding_window_mask(1, window=window)  # validates window
        self.window = window
        self._reset_parameters()

    # Whether attention may run sequence by sequence with no mask on packed tokens; False
    # for subclasses that add terms to the scores inside _attention_core.
    _attends_by_sequence = True

    # The attention function this module calls (attnlab.attention.interface); the
    # inspection tools switch it for the length of a block.
    attn_implementation = "sdpa"

    def supports_packing(self) -> bool:
        """Whether an encoder may hand this module packed tokens (``packing=``): plain
        :class:`MultiHeadAttention` and subclasses that say so."""
        return type(self) is MultiHeadAttention

    def _reset_parameters(self) -> None:
        if self.packed:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    def _weights(self) -> tuple[Tensor, Tensor, Tensor]:
        if self.packed:
            return self.in_proj_weight.chunk(3)
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight

    def _biases(self) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        if self.in_proj_bias is None:
            return None, None, None
        return self.in_proj_bias.chunk(3)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, L, D]

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, E = query.shape
        if self.packed and query is key and key is value:
            qkv = linear(query, self.in_proj_weight, self.in_proj_bias)  # [B, T, 3E]
            # unbind, not three indexings: its backward stacks the three gradients
            # straight into the [B, T, 3, H, D] layout of `qkv` (one copy), where
            # indexing would build and sum three zero-filled [B, T, 3E] gradients.
            q, k, v = qkv.view(B, T, 3, self.num_heads, self.head_dim).unbind(2)  # each [B, T, H, D]
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # each [B, H, T, D]
        w_q, w_k, w_v = self._weights()
        b_q, b_k, b_v = self._biases()
        q = self._split_heads(linear(query, w_q, b_q))
        k = self._split_heads(linear(key, w_k, b_k))
        v = self._split_heads(linear(value, w_v, b_v))
        return q, k, v

    def _attend_packed(
        self,
        x: Tensor,
        packing: TokenPacking,
        mask: Optional[Tensor],
        attn_bias: Optional[Tensor],
        need_weights: bool,
        average_attn_weights: bool,
        head_mask: Optional[Tensor],
    ) -> AttentionResult:
        """Self-attention over packed rows ``x`` ``[N, E]``; see ``packing`` in the class docs."""
        if not isinstance(x, Tensor) or x.dim() != 2 or x.shape != (packing.num_tokens, self.d_model):
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(
                f"with packing, query must be the packed [N, E] = [{packing.num_tokens}, {self.d_model}] "
                f"real tokens, got {got}"
            )
        if not self.packed:
            raise ValueError("packing needs self-attention with kdim == vdim == d_model")
        qkv = linear(x, self.in_proj_weight, self.in_proj_bias)  # [N, 3E]
        by_sequence = (
            not need_weights
            and self._attends_by_sequence
            and self.attn_implementation == "sdpa"
            and mask is None
            and attn_bias is None
            and (self.rotary is None or packing.is_prefix)
            and packing.attend_by_sequence(self.inner_dim)
        )
        if by_sequence:
            return AttentionResult(self.out_proj(self._attend_by_sequence(qkv, packing, head_mask)), None)
        B, T, E, H, D = packing.batch, packing.length, self.inner_dim, self.num_heads, self.head_dim
        mask = combine_masks(mask, padding_to_attention_mask(packing.mask))  # [B|1, H|1, T, T]
        if self.attn_implementation != "sdpa":  # another function sees only real query rows too
            mask = combine_masks(mask, packing.mask[:, None, :, None])  # [B, H|1, T, T]
        qkv = packing.unpack(qkv)  # [B, T, 3HD]
        q, k, v = (part.transpose(1, 2) for part in qkv.view(B, T, 3, H, D).unbind(2))  # [B, H, T, D]
        out, weights = self._attention_core(q, k, v, mask, attn_bias, False, need_weights, head_mask)
        out = self.out_proj(packing.pack(out.transpose(1, 2).reshape(B, T, E)))  # [N, E]
        if weights is not None:
            weights = packing.zero_padding_queries(weights)
            if average_attn_weights:
                weights = weights.mean(dim=1)  # [B, T, S]
        return AttentionResult(out, weights)

    def _attend_by_sequence(self, qkv: Tensor, packing: TokenPacking, head_mask: Optional[Tensor]) -> Tensor:
        """Fused attention sequence by sequence on packed ``qkv`` ``[N, 3E]`` -> ``[N, E]``.

        Each sequence attends over its own real tokens only, with no mask: no work on
        padding at all, where the padded layout spends ``B * T^2`` on it.
        """
        if bf16_is_emulated(qkv):  # as attention() does: see attnlab._precision
            with torch.autocast("cpu", enabled=False):
                return self._attend_by_sequence(qkv.float(), packing, head_mask).to(qkv.dtype)
        H, D, E = self.num_heads, self.head_dim, self.inner_dim
        head_mask = combined_head_mask(self, head_mask)
        scale = None if head_mask is None else head_mask_scale(head_mask, H, packing.batch).to(qkv.dtype)
        outputs = []
        q, k, v = qkv.view(-1, 3, H, D).unbind(1)  # each [N, H, D]
        if self.rotary is not None:  # right padding only: a token's position is its column
            positions = packing.index % packing.length  # [N]
            q, k = self.rotary.rotate_positions(q, positions), self.rotary.rotate_positions(k, positions)
        # One split, not a slice per sequence: the backward of a slice builds a gradient of
        # the whole [N, E] each time, where split's backward is one concatenation.
        pieces = zip(q.split(packing.lengths), k.split(packing.lengths), v.split(packing.lengths))
        for sequence, rows in enumerate(pieces):  # each [t, H, D]
            count = rows[0].shape[0]
            if count == 0:
                continue
            q_seq, k_seq, v_seq = (part[None].transpose(1, 2) for part in rows)  # [1, H, t, D]
            local = None
            if self.window is not None and count > self.window + 1:  # else every key is in reach
                local = sliding_window_mask(count, window=self.window, device=qkv.device)  # [t, t]
            out = F.scaled_dot_product_attention(
                q_seq, k_seq, v_seq, attn_mask=local, dropout_p=self.dropout if self.training else 0.0
            )  # [1, H, t, D]
            if scale is not None:
                out = out * scale[sequence if scale.shape[0] > 1 else 0]
            outputs.append(out.transpose(1, 2).reshape(count, E))
        if not outputs:
            return qkv.new_zeros(0, E)
        return torch.cat(outputs)  # [N, E]

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
        """Rotary, attention and head mask on ``[B, H, T|S, D]`` heads."""
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if self.window is not None:
            local = sliding_window_mask(q.shape[2], k.shape[2], window=self.window, device=q.device)
            local = local[None, None]  # [1, 1, T, S]
            mask = local if mask is None else combine_masks(mask, local)  # [B|1, H|1, T, S]
        return attend(self, q, k, v, mask, attn_bias=attn_bias, dropout=self.dropout if self.training else 0.0,
                      is_causal=is_causal, need_weights=need_weights, head_mask=head_mask)

    def _scale_heads(
        self, out: Tensor, weights: Optional[Tensor], head_mask: Optional[Tensor]
    ) -> AttentionResult:
        """Each head's output (and weights) times its ``head_mask`` entry; as they are without one."""
        return scale_heads(out, weights, head_mask)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for name, tensor, width in (
            ("query", query, self.d_model),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dim() != 3 or tensor.shape[-1] != width:
                raise ValueError(
                    f"{name} must be [B, length, {width}], got shape {tuple(tensor.shape)}"
                )
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(
                f"key and value must share [B, S]; got key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if query.shape[0] != key.shape[0]:
            raise ValueError(
                f"query and key must share the batch size; got {query.shape[0]} and {key.shape[0]}"
            )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        attn_bias: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        average_attn_weights: bool = False,
        is_causal: bool = False,
        head_mask: Optional[Tensor] = None,
        packing: Optional[TokenPacking] = None,
    ) -> AttentionResult:
        refuse_key_padding_mask(key_padding_mask)
        check_inputs_match(self, type(self).__name__, {"query": query, "key": key, "value": value})
        if packing is not None:
            if not (query is key and key is value):
                raise ValueError(
                    "packing applies to self-attention only: pass the same tensor as query, key and value"
                )
            if attention_mask is not None or attn_mask is not None or is_causal:
                raise ValueError("with packing, pass padding and causal constraints in mask")
            B, T = packing.batch, packing.length
            keep, bias = gather_masks(B, self.num_heads, T, T, query.dtype, mask=mask, attn_bias=attn_bias)
            return self._attend_packed(
                query, packing, keep, bias, need_weights, average_attn_weights, head_mask
            )
        self._check_inputs(query, key, value)
        B, T, E = query.shape
        S = key.shape[1]
        keep, bias = gather_masks(B, self.num_heads, T, S, query.dtype, mask=mask, attention_mask=attention_mask,
                                  attn_bias=attn_bias, attn_mask=attn_mask)
        q, k, v = self._project(query, key, value)  # [B, H, T|S, D]
        out, weights = self._attention_core(q, k, v, keep, bias, is_causal, need_weights, head_mask)
        out = out.transpose(1, 2).reshape(B, T, self.inner_dim)  # [B, T, H * D]
        out = self.out_proj(out)  # [B, T, E]
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # [B, T, S]
        return AttentionResult(out, weights)

    @torch.no_grad()
    def prune_heads(self, heads: Iterable[int]) -> None:
        """Remove heads (0-based, of the current ones): the projections lose their rows and
        columns, so the module computes exactly what it computed with those heads' outputs
        zeroed, with less work. At least one head must remain.

        Example:
            >>> mha = MultiHeadAttention(64, 8, dropout=0.0)
            >>> mha.prune_heads([0, 5])
            >>> mha.num_heads, mha.in_proj_weight.shape, mha.out_proj.weight.shape
            (6, torch.Size([144, 64]), torch.Size([64, 48]))
        """
        removed = sorted({int(head) for head in heads})
        if any(not 0 <= head < self.num_heads for head in removed):
            raise ValueError(f"heads must lie in 0..{self.num_heads - 1}, got {removed}")
        if len(removed) == self.num_heads:
            raise ValueError(f"cannot remove all {self.num_heads} heads of a layer; keep at least one")
        if not removed:
            return
        D = self.head_dim
        kept = [head for head in range(self.num_heads) if head not in removed]
        rows = torch.cat([torch.arange(head * D, (head + 1) * D) for head in kept])  # kept columns of H * D
        inner = self.inner_dim

        def shrink(parameter: Optional[nn.Parameter], index: Tensor, dim: int) -> Optional[nn.Parameter]:
            if parameter is None:
                return None
            return nn.Parameter(parameter.index_select(dim, index.to(parameter.device)).clone())

        if self.packed:
            packed_rows = torch.cat([rows + part * inner for part in range(3)])  # Q, K, V blocks
            self.in_proj_weight = shrink(self.in_proj_weight, packed_rows, 0)
        else:
            self.q_proj_weight = shrink(self.q_proj_weight, rows, 0)
            self.k_proj_weight = shrink(self.k_proj_weight, rows, 0)
            self.v_proj_weight = shrink(self.v_proj_weight, rows, 0)
        if self.in_proj_bias is not None:  # Q, K and V blocks, as the packed weight
            qkv_rows = torch.cat([rows + part * inner for part in range(3)])
            self.in_proj_bias = shrink(self.in_proj_bias, qkv_rows, 0)
        self.out_proj.weight = shrink(self.out_proj.weight, rows, 1)
        self.out_proj.in_features = len(rows)
        self.num_heads = len(kept)
        self.inner_dim = len(kept) * D

    def extra_repr(self) -> str:
        extra = f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"
        if self.inner_dim != self.d_model:
            extra += f", head_dim={self.head_dim}"
        if not self.packed:
            extra += f", kdim={self.kdim}, vdim={self.vdim}"
        extra += ", rotary=True" if self.rotary is not None else ""
        return extra + (f", window={self.window}" if self.window is not None else "")
