"""attnlab: build, train and look inside Transformer attention.

The article's names are importable from here::

    from attnlab import MultiHeadAttention, TransformerEncoder, TransformerTrainer, AttentionAnalyzer

and every subpackage is an attribute: ``attnlab.attention`` (kernels, masks, attention
modules; the kernel function itself is ``attnlab.attention.attention``),
``attnlab.layers``, ``attnlab.models``, ``attnlab.checkpoints``, ``attnlab.data``, ``attnlab.train``,
``attnlab.inspect``, ``attnlab.outputs``.

One loader opens everything: ``model, tokenizer, config = attnlab.load(path_or_name)``
(an attnlab run or checkpoint, a HuggingFace directory or GGUF file, or ``"minilm"``); the
model classes' ``from_pretrained`` and ``attnlab.from_pretrained`` are aliases of it, and
``save_pretrained`` writes what it opens.
"""

from . import _moved

_moved.install()  # old module paths (attnlab.models.pretrained, ...) keep importing

from . import attention, checkpoints, data, inspect, layers, models, outputs, train
from .attention import (
    AttentionResult,
    CrossModalAttention,
    CrossModalOutput,
    MultiHeadAttention,
    RotaryEmbedding,
    ScaledDotProductAttention,
    SparseAttention,
    causal_mask,
    combine_masks,
    padding_mask,
    padding_mask_from_ids,
)
from .inspect import AttentionAnalyzer, attention_rollout, capture_attention, head_importance, mask_heads
from .layers import (
    EncoderConfig,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    PositionWiseFFN,
    TransformerEncoderLayer,
)
from .models import EncoderClassifier, EncoderForMaskedLM, EncoderOutput, TransformerEncoder, prune_heads
from .checkpoints.loading import from_pretrained
from .loading import load
from .outputs import LayerAttentions, ModelOutput
from .train.trainer import TransformerTrainer

__version__ = "0.1.0"

__all__ = [
    "AttentionAnalyzer",
    "AttentionResult",
    "CrossModalAttention",
    "CrossModalOutput",
    "EncoderClassifier",
    "EncoderConfig",
    "EncoderForMaskedLM",
    "EncoderOutput",
    "LayerAttentions",
    "LearnedPositionalEmbedding",
    "ModelOutput",
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
    "attention_rollout",
    "capture_attention",
    "causal_mask",
    "checkpoints",
    "combine_masks",
    "data",
    "from_pretrained",
    "head_importance",
    "inspect",
    "layers",
    "load",
    "mask_heads",
    "models",
    "outputs",
    "padding_mask",
    "padding_mask_from_ids",
    "prune_heads",
    "train",
]
