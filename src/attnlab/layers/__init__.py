"""Components of the encoder and the decoder: layers, feed-forward nets, norms, positions.

The models that stack them are :mod:`attnlab.models` (:class:`~attnlab.models.encoder.TransformerEncoder`,
:class:`~attnlab.models.decoder.DecoderForCausalLM`). ``attnlab.layers.TransformerEncoder`` and
``attnlab.layers.EncoderOutput`` still work (:mod:`attnlab._moved`).
"""

from .._moved import moved_names
from .._precision import Linear
from .dropout import Dropout
from .encoder_config import EncoderConfig
from .encoder_layer import EncoderLayerOutput, TransformerEncoderLayer
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

__getattr__ = moved_names(__name__)  # TransformerEncoder, EncoderOutput: attnlab.models.encoder
