"""SparseAttention: block-local attention plus a global summary, for long inputs.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` sequence length, ``D`` head dim,
``E`` model dim, ``L`` block size.

Masks follow attnlab's one contract (:mod:`attnlab.attention.masks`): ``True`` / 1 = may
attend, in any dtype.
Only key-padding masks are taken (``[B, T]``, ``[B, 1, T]`` or ``[B, 1, 1, T]``): a
general ``[T, T]`` mask would need the dense pattern this module exists to avoid.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import Tensor, nn

from ..._checks import check_inputs_match, check_positive_int, check_probability
from ..._masked_mean import masked_mean
from ..._precision import Linear, linear
from .block_sparse import BlockSparseWeights, block_sparse_attention
from ..functional import AttentionResult, attention
from ..masks import combine_masks, head_mask_scale, keep_mask, refuse_key_padding_mask
from ..rotary import RotaryEmbedding

__all__ = ["SparseAttention", "DENSE_WEIGHTS_MAX_LEN", "WEIGHTS_LAYOUTS"]

WEIGHTS_LAYOUTS = ("dense", "blocks")
# A dense weights view is B * H * T * T numbers: 512 MiB at B=1, H=8, T=4096 in float32.
DENSE_WEIGHTS_MAX_LEN = 4096


def _check_global_tokens(global_tokens: Iterable[int]) -> tuple[int, ...]:
    try:
        positions = tuple(global_tokens)
    except TypeError:
        raise TypeError(f"global_tokens must be a sequence of positions, got {global_tokens!r}") from None
    for position in positions:
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            raise ValueError(f"global_tokens must hold non-negative int positions, got {positions!r}")
    return tuple(sorted(set(positions)))


class SparseAttention(nn.Module):
    """Block-local self-attention with a global summary and optional global tokens.

    The article's ``SparseAttention`` made exact, any-length and linear in ``T``.
    Per head, with ``q, k, v`` the projections ``local_q, local_k, local_v`` of the
    input split into heads, the output of position ``i`` is ``dense`` applied to

    ``sparse_i + summary``  (the summary only on rows that have a key; see below), where

    * ``sparse_i = softmax_j(q_i . k_j / sqrt(D)) v_j`` over the keys ``j`` that ``i``
      may attend: the keys in ``i``'s block of ``block_size`` positions (blocks are
      ``[0, L), [L, 2L), ...``; the last may be short) and in ``window`` blocks on each
      side; plus every **global token** ``j in global_tokens`` (Longformer style);
      a global token ``i`` itself attends every key. Keys masked out by the padding
      mask are never attended.
    * ``summary`` (``global_summary=True``) is one per-head context shared by all
      positions: the pooled query ``q_bar = global_q(mean of x over valid positions)``
      (which equals the mean over valid positions of the projected global queries)
      attends over all valid keys ``global_k(x_j)`` with scale ``1 / sqrt(D)`` and
      mixes the *projected* values ``v_j``: ``summary = softmax_j(q_bar . k_j / sqrt(D)) v_j``.
      It is added to every position that has at least one key to attend.

    A row with no key to attend (all its candidate keys are padding) has zero output.
    "Valid positions" are those the padding mask allows. Memory and time are
    ``O(T * (2 * window + 1) * block_size)`` forward and backward (see
    :func:`~attnlab.attention.block_sparse.block_sparse_attention`); nothing falls back
    to dense attention. Any ``T`` works: the input is padded to whole blocks inside and
    the padding is masked and cut off.

    This is **self-attention over one sequence**: queries and keys are the same
    positions (``key`` and ``value`` may be other tensors, but of the query's length,
    e.g. ``x, x, x``). Cross-attention between sequences of different lengths raises a
    ``ValueError``; use :class:`~attnlab.attention.MultiHeadAttention` for it.

    Parameter names follow the article (``local_q``, ``local_k``, ``local_v``,
    ``global_q``, ``global_k``, ``dense``), so its ``state_dict`` loads.

    Args:
        d_model: model width ``E``; divisible by ``num_heads``.
        num_heads: heads ``H``.
        block_size: positions per block ``L``.
        dropout: dropout on the attention probabilities (training only).
        window: neighbouring blocks attended on each side (0: own block only, as in
            the article; 1: a sliding window of three blocks).
        global_summary: add the pooled global context (the article's global part).
        global_tokens: positions (e.g. ``(0,)`` for a ``[CLS]`` token) that attend to
            all keys and are attended by all queries; positions ``>= T`` of a shorter
            input are ignored.
        bias: biases in the projections.
        rotary: rotary positions on the local queries and keys (the summary's pooled
            query has no position and is not rotated).
        rotary_base: frequency base of the rotary embedding.
        weights_layout: what ``need_weights=True`` returns: ``"dense"`` (a
            ``[B, H, T, T]`` tensor, for ``T <= DENSE_WEIGHTS_MAX_LEN``) or ``"blocks"``
            (a :class:`~attnlab.attention.block_sparse.BlockSparseWeights`, any ``T``).

    Shape:
        query, key, value ``[B, T, E]``; ``mask``: key padding as ``[B, 1, 1, T]``,
        ``[B, 1, T]`` or ``[B, T]`` (``True`` / 1 = may attend, any dtype; batch may be 1);
        ``attention_mask`` ``[B, T]`` (``True`` / 1 on real tokens, HuggingFace's);
        ``key_padding_mask`` is refused (see :mod:`attnlab.attention.masks`); ``head_mask`` ``[H]``
        or ``[B, H]``. Returns ``(output [B, T, E], weights)``: weights are ``None``
        unless ``need_weights=True``. The dense view ``M`` ``[B, H, T, T]`` satisfies
        ``per-head output = M @ v`` exactly: sparse probabilities plus the summary's
        weights on every row with a key (rows sum to 2 with a summary, 1 without, 0
        for rows with no key); ``average_attn_weights=True`` averages it over heads.

    Example:
        >>> attn = SparseAttention(64, 4, block_size=16, dropout=0.0, window=1, global_tokens=(0,))
        >>> x = torch.randn(2, 50, 64)
        >>> out, weights = attn(x, x, x, need_weights=True)
        >>> out.shape, weights.shape
        (torch.Size([2, 50, 64]), torch.Size([2, 4, 50, 50]))
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        block_size: int = 32,
        dropout: float = 0.1,
        *,
        window: int = 0,
        global_summary: bool = True,
        global_tokens: Iterable[int] = (),
        bias: bool = True,
        rotary: bool = False,
        rotary_base: float = 10000.0,
        weights_layout: str = "dense",
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("num_heads", num_heads)
        check_positive_int("block_size", block_size)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"window must be an int >= 0 (blocks on each side), got {window!r}")
        if weights_layout not in WEIGHTS_LAYOUTS:
            raise ValueError(f"weights_layout must be one of {WEIGHTS_LAYOUTS}, got {weights_layout!r}")
        factory = {"device": device, "dtype": dtype}
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.block_size = block_size
        self.window = window
        self.dropout = check_probability("dropout", dropout)
        self.global_tokens = _check_global_tokens(global_tokens)
        self.weights_layout = weights_layout
        self.local_q = Linear(d_model, d_model, bias=bias, **factory)
        self.local_k = Linear(d_model, d_model, bias=bias, **factory)
        self.local_v = Linear(d_model, d_model, bias=bias, **factory)
        if global_summary:
            self.global_q: Optional[Linear] = Linear(d_model, d_model, bias=bias, **factory)
            self.global_k: Optional[Linear] = Linear(d_model, d_model, bias=bias, **factory)
        else:
            self.global_q = self.global_k = None
        self.dense = Linear(d_model, d_model, bias=bias, **factory)
        self.rotary = RotaryEmbedding(self.head_dim, rotary_base, device=device) if rotary else None

    @property
    def global_summary(self) -> bool:
        return self.global_q is not None

    # ----------------------------------------------------------------- inputs
    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, is_causal: bool) -> None:
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dim() != 3 or tensor.shape[-1] != self.d_model:
                raise ValueError(f"{name} must be [B, T, {self.d_model}], got shape {tuple(tensor.shape)}")
        if key.shape[:2] != query.shape[:2] or value.shape[:2] != query.shape[:2]:
            raise ValueError(
                "SparseAttention is self-attention over one sequence: query, key and value must "
                f"share [B, T] (block locality pairs query i with keys near position i); got query "
                f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}. "
                "Use MultiHeadAttention for cross-attention"
            )
        if is_causal:
            raise ValueError("SparseAttention does not support is_causal=True; its pattern is bidirectional")

    def _key_mask(
        self, mask: Optional[Tensor], attention_mask: Optional[Tensor], batch: int, length: int
    ) -> Optional[Tensor]:
        """Fold ``mask`` and ``attention_mask`` into one ``[B, T]`` bool key mask."""
        masks = []
        for name, given in (("mask", mask), ("attention_mask", attention_mask)):
            if given is None:
                continue
            given = keep_mask(given, name=name, bias_argument=None)
            shape = tuple(given.shape)
            if name == "mask":
                key_only = (
                    (given.dim() == 4 and shape[1:3] == (1, 1)) or (given.dim() == 3 and shape[1] == 1)
                    or given.dim() == 2
                )
            else:
                key_only = given.dim() == 2
            if not key_only or shape[-1] != length or shape[0] not in (1, batch):
                expected = "[B, 1, 1, T], [B, 1, T] or [B, T]" if name == "mask" else "[B, T]"
                raise ValueError(
                    f"SparseAttention takes key-padding masks only: {name} must be {expected} with "
                    f"B={batch} (or 1) and T={length}, got {shape}. A mask that varies per query would "
                    "need the dense T x T pattern; use MultiHeadAttention for it"
                )
            masks.append(given.reshape(shape[0], length).expand(batch, length))  # [B, T]
        return combine_masks(*masks)

    # ------------------------------------------------------------- projections
    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """Local q, k, v ``[B, H, T, D]`` and the summary keys ``[B, H, T, D]`` (or None)."""
        B, T, E = query.shape
        H, D = self.num_heads, self.head_dim
        if query is key and key is value:
            # One GEMM for every projection of x; the heads are views of its output.
            layers = [self.local_q, self.local_k, self.local_v] + ([self.global_k] if self.global_k is not None else [])
            weight = torch.cat([layer.weight for layer in layers])  # [P * E, E]
            bias = None if self.local_q.bias is None else torch.cat([layer.bias for layer in layers])
            projected = linear(query, weight, bias).view(B, T, len(layers), H, D)  # [B, T, P, H, D]
            heads = [part.transpose(1, 2) for part in projected.unbind(2)]  # each [B, H, T, D]
            return heads[0], heads[1], heads[2], heads[3] if self.global_k is not None else None
        q = self.local_q(query).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        k = self.local_k(key).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        v = self.local_v(value).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        summary_keys = self.global_k(key).view(B, T, H, D).transpose(1, 2) if self.global_k is not None else None
        return q, k, v, summary_keys

    def _summary(
        self, query: Tensor, summary_keys: Tensor, values: Tensor, key_mask: Optional[Tensor], need_weights: bool
    ) -> AttentionResult:
        """The pooled query's context ``[B, H, 1, D]`` and weights ``[B, H, 1, T]``."""
        B, T, E = query.shape
        if key_mask is None:
            pooled = query.mean(dim=1, keepdim=True)  # [B, 1, E]
            bias = None
        else:
            valid = key_mask if key_mask.dtype == torch.bool else key_mask > float("-inf")  # [B, T]
            pooled = masked_mean(query, valid)  # [B, 1, E]
            bias = key_mask[:, None, None, :]  # [B, 1, 1, T]
        pooled_query = self.global_q(pooled).view(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        return attention(
            pooled_query,  # [B, H, 1, D]
            summary_keys,
            values,
            bias,
            dropout_p=self.dropout if self.training else 0.0,
            need_weights=need_weights,
        )

    # ----------------------------------------------------------------- forward
    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        need_weights: bool = False,
        average_attn_weights: bool = False,
        is_causal: bool = False,
        head_mask: Optional[Tensor] = None,
    ) -> AttentionResult:
        """Attend; see the class docstring for the exact pattern, masks and weights."""
        self._check_inputs(query, key, value, is_causal)
        check_inputs_match(self, "SparseAttention", {"query": query, "key": key, "value": value})
        B, T, E = query.shape
        refuse_key_padding_mask(key_padding_mask)
        key_mask = self._key_mask(mask, attention_mask, B, T)  # [B, T] | None
        if need_weights and self.weights_layout == "dense" and T > DENSE_WEIGHTS_MAX_LEN:
            raise ValueError(
                f"need_weights=True with weights_layout='dense' builds [B, H, T, T] weights; T={T} is "
                f"above {DENSE_WEIGHTS_MAX_LEN}. Build the module with weights_layout='blocks'"
            )
        if need_weights and average_attn_weights and self.weights_layout == "blocks":
            raise ValueError("average_attn_weights=True needs weights_layout='dense'")
        scale = (  # [B|1, H, 1, 1]
            None if head_mask is None else head_mask_scale(head_mask, self.num_heads, B).to(query.dtype)
        )
        q, k, v, summary_keys = self._project(query, key, value)  # [B, H, T, D] each
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        dropout_p = self.dropout if self.training else 0.0
        out, weights, row_has_key = block_sparse_attention(
            q,
            k,
            v,
            key_mask,
            block_size=self.block_size,
            window=self.window,
            global_positions=self.global_tokens,
            dropout_p=dropout_p,
            need_weights=need_weights,
        )  # [B, H, T, D], BlockSparseWeights | None, [B, T]
        if summary_keys is not None:
            context, summary_weights = self._summary(query, summary_keys, v, key_mask, need_weights)
            out = out + context * row_has_key[:, None, :, None].to(out.dtype)  # [B, H, T, D]
            if weights is not None:
                weights = weights._replace(summary=summary_weights)
        if scale is not None:
            out = out * scale
        out = self.dense(out.transpose(1, 2).reshape(B, T, E))  # [B, T, E]
        if weights is None:
            return AttentionResult(out, None)
        return AttentionResult(out, self._weights_view(weights, scale, average_attn_weights))

    def _weights_view(
        self, weights: BlockSparseWeights, scale: Optional[Tensor], average: bool
    ) -> Tensor | BlockSparseWeights:
        if self.weights_layout == "blocks":
            if scale is None:
                return weights
            return weights._replace(
                local=weights.local * scale[..., None],
                global_rows=weights.global_rows * scale,
                summary=None if weights.summary is None else weights.summary * scale,
            )
        dense = weights.to_dense()  # [B, H, T, T]
        if scale is not None:
            dense = dense * scale
        return dense.mean(dim=1) if average else dense

    def extra_repr(self) -> str:
        extra = (
            f"d_model={self.d_model}, num_heads={self.num_heads}, block_size={self.block_size}, "
            f"dropout={self.dropout}, window={self.window}, global_summary={self.global_summary}"
        )
        if self.global_tokens:
            extra += f", global_tokens={self.global_tokens}"
        return extra + (", rotary=True" if self.rotary is not None else "")
