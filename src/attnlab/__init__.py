"""attnlab: build, train and look inside Transformer attention.

The article's names are importable from here::

    from attnlab import MultiHeadAttention, TransformerEncoder
"""

from .attention import (
    AttentionResult,
    CrossModalAttention,
    CrossModalOutput,
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
from .models.pretrained import from_pretrained
from .train.trainer import TransformerTrainer

__version__ = "0.1.0"

__all__ = [
    "AttentionResult",
    "CrossModalAttention",
    "CrossModalOutput",
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
    "TransformerTrainer",
    "attention",
    "causal_mask",
    "combine_masks",
    "from_pretrained",
    "padding_mask",
    "padding_mask_from_ids",
]
