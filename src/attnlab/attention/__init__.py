"""Attention kernels and modules."""

from .cross_modal import CrossModalAttention, CrossModalOutput
from .disentangled import DisentangledSelfAttention, RelativePositionTable
from .functional import AttentionResult, attention, fused_attention, reference_attention
from .masks import (
    causal_mask,
    combine_masks,
    from_torch_mask,
    keep_mask,
    mask_to_additive,
    mask_with_bias,
    padding_mask,
    padding_mask_from_ids,
    padding_to_attention_mask,
    sliding_window_mask,
    validate_attention_bias,
    validate_attention_mask,
)
from .multihead import MultiHeadAttention
from .position_bias import RelativePositionBias
from .rotary import RotaryEmbedding
from .scaled_dot_product import ScaledDotProductAttention
from .sparse import (
    BlockSparseResult,
    BlockSparseWeights,
    SparseAttention,
    block_pattern_density,
    block_sparse_attention,
    block_sparse_mask,
    draw_sparsity_pattern,
)

__all__ = [
    "CrossModalAttention",
    "CrossModalOutput",
    "AttentionResult",
    "attention",
    "fused_attention",
    "reference_attention",
    "causal_mask",
    "combine_masks",
    "from_torch_mask",
    "keep_mask",
    "mask_to_additive",
    "mask_with_bias",
    "padding_mask",
    "padding_mask_from_ids",
    "padding_to_attention_mask",
    "sliding_window_mask",
    "validate_attention_bias",
    "validate_attention_mask",
    "MultiHeadAttention",
    "DisentangledSelfAttention",
    "RelativePositionBias",
    "RelativePositionTable",
    "ScaledDotProductAttention",
    "RotaryEmbedding",
    "SparseAttention",
    "BlockSparseResult",
    "BlockSparseWeights",
    "block_sparse_attention",
    "block_sparse_mask",
    "block_pattern_density",
    "draw_sparsity_pattern",
]
