"""Encoder building blocks."""

from .encoder import EncoderLayerOutput, EncoderOutput, TransformerEncoder, TransformerEncoderLayer
from .encoder_config import EncoderConfig
from .ffn import PositionWiseFFN
from .positional import LearnedPositionalEmbedding, PositionalEncoding, RotaryEmbedding, sinusoidal_table

__all__ = [
    "EncoderConfig",
    "EncoderLayerOutput",
    "EncoderOutput",
    "LearnedPositionalEmbedding",
    "PositionalEncoding",
    "PositionWiseFFN",
    "RotaryEmbedding",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "sinusoidal_table",
]
