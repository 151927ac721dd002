"""Task models over :class:`~attnlab.TransformerEncoder` and their files on disk."""

from .classifier import POOLINGS, EncoderClassifier, pool
from .factory import build_encoder, load_pretrained_tokenizer
from .masked_lm import EncoderForMaskedLM
from .outputs import ModelOutput, TaskOutput
from .pruning import prune_heads
from .serialization import LoadedModel, build_model, load_model, model_config, resolve_checkpoint_dir, save_model

__all__ = [
    "EncoderClassifier",
    "EncoderForMaskedLM",
    "LoadedModel",
    "ModelOutput",
    "TaskOutput",
    "POOLINGS",
    "build_encoder",
    "build_model",
    "load_model",
    "load_pretrained_tokenizer",
    "model_config",
    "pool",
    "prune_heads",
    "resolve_checkpoint_dir",
    "save_model",
]
