"""attnlab: build, train and look inside Transformer attention.

The article's names are importable from here::

    from attnlab import MultiHeadAttention, TransformerEncoder
"""

from .attention import (
    AttentionResult,
    MultiHeadAttention,
    RotaryEmbedding,
    ScaledDotProductAttention,
    SparseAttention,
    attention,
    causal_mask,
    combine_masks,
    padding_mask,
    padding_mask_from_ids,
)
from .layers import (
    EncoderConfig,
    EncoderOutput,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    PositionWiseFFN,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionResult",
    "EncoderConfig",
    "EncoderOutput",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionWiseFFN",
    "RotaryEmbedding",
    "ScaledDotProductAttention",
    "SparseAttention",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "attention",
    "causal_mask",
    "combine_masks",
    "padding_mask",
    "padding_mask_from_ids",
]
