"""Encoder building blocks."""

from .._precision import Linear
from .dropout import Dropout
from .encoder import EncoderLayerOutput, EncoderOutput, TransformerEncoder, TransformerEncoderLayer
from .encoder_config import EncoderConfig
from .ffn import GatedFFN, PositionWiseFFN, SwiGLUFFN
from .positional import LearnedPositionalEmbedding, PositionalEncoding, RotaryEmbedding, sinusoidal_table

__all__ = [
    "Dropout",
    "EncoderConfig",
    "EncoderLayerOutput",
    "EncoderOutput",
    "GatedFFN",
    "LearnedPositionalEmbedding",
    "Linear",
    "PositionalEncoding",
    "PositionWiseFFN",
    "RotaryEmbedding",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "SwiGLUFFN",
    "sinusoidal_table",
]
