"""The architectures: the encoder (:mod:`.encoder`) with its task models, and the
decoder-only language model (:mod:`.decoder`).

Files on disk (attnlab's own layout, HuggingFace families, GGUF) are
:mod:`attnlab.checkpoints`'s.
"""

from .classifier import POOLINGS, EncoderClassifier, pool
from .encoder import EncoderOutput, TransformerEncoder, find_encoder
from .masked_lm import EncoderForMaskedLM
from .outputs import ModelOutput, TaskOutput
from .pruning import prune_heads

__all__ = [
    "EncoderClassifier",
    "EncoderForMaskedLM",
    "EncoderOutput",
    "ModelOutput",
    "TaskOutput",
    "POOLINGS",
    "pool",
    "TransformerEncoder",
    "find_encoder",
    "prune_heads",
]

# Names that lived here before the file formats moved to attnlab.checkpoints.
_MOVED_NAMES = ("LoadedModel", "build_encoder", "build_model", "load_model", "load_pretrained_tokenizer",
                "model_config", "resolve_checkpoint_dir", "save_model")


def __getattr__(name: str):
    if name in _MOVED_NAMES:
        # ImportError, not AttributeError: `from attnlab.models import load_model` shows this line
        raise ImportError(f"attnlab.models.{name} moved: import it from attnlab.checkpoints "
                             f"(from attnlab.checkpoints import {name}), or open any model with attnlab.load")
    raise AttributeError(f"module 'attnlab.models' has no attribute {name!r}")
