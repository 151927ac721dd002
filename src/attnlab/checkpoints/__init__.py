"""Models on disk: every file format attnlab reads and writes, and the one loader.

``attnlab.load(path_or_name)`` (:func:`~attnlab.checkpoints.loading.load`) looks at what it
is given once (:mod:`~attnlab.checkpoints.source`: the format, encoder or decoder, an
encoder's family, and the ``config.json`` read once) and opens it with the format's reader:

* ``attnlab_layout``: attnlab's own run and checkpoint directories (``save_model``,
  ``read_checkpoint``);
* ``encoders/``: HuggingFace encoder families, one conversion table each (``Family``);
* ``decoders/``: HuggingFace decoder layouts (GPT-2, Llama, Mistral, Qwen2), read and
  written through the same converter;
* ``gguf/``: llama.cpp's GGUF files (weights and tokenizer, parsed once).

``load_model``, ``from_pretrained``, ``load_decoder``, ``build_encoder(pretrained=...)`` and
``Class.from_pretrained`` are aliases of ``load``. ``tensors`` reads safetensors one tensor
at a time and resolves the load dtype; ``errors`` holds :class:`UnsupportedCheckpointError`.
"""

from .attnlab_layout import (
    LoadedModel,
    build_model,
    model_config,
    resolve_checkpoint_dir,
    save_model,
)
from .errors import UnsupportedCheckpointError
from .factory import build_encoder, load_pretrained_tokenizer
from .loading import FORMATS, detect_format, from_pretrained, load, load_decoder, load_model, save
from .source import Source, find_checkpoint_dir, open_source

__all__ = [
    "FORMATS",
    "LoadedModel",
    "Source",
    "UnsupportedCheckpointError",
    "build_encoder",
    "build_model",
    "detect_format",
    "find_checkpoint_dir",
    "from_pretrained",
    "load",
    "load_decoder",
    "load_model",
    "load_pretrained_tokenizer",
    "model_config",
    "open_source",
    "resolve_checkpoint_dir",
    "save",
    "save_model",
]
