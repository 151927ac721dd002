"""attnlab's own layout: ``model.safetensors`` + ``config.json`` (no pickle), written by
:func:`save_model` and read by :func:`read_checkpoint` (``attnlab.load`` hands it the
``config.json`` it read; ``load_model`` is an alias of ``attnlab.load``).

``config.json`` is ``{"model_type": ..., "encoder": EncoderConfig dict, "head": {...}}``, and
``"pretrained_config"`` (the HuggingFace ``config.json``) for an encoder opened from a
pretrained family, whose components are rebuilt from it. A decoder's is
``{"model_type": "decoder", "decoder": DecoderConfig dict}``, with ``"pretrained_config"``
when it was opened from a HuggingFace directory (kept for its HuggingFace layout).
A run directory (``attnlab train --out DIR``) holds ``checkpoints/{best,last}/`` with
these files and ``tokenizer.json`` at its top; ``attnlab.load`` accepts either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import safetensors.torch
import torch
from torch import nn

from .._files import follow_umask, load_safetensors_into, write_json
from .._pretrained_io import loader_aliases
from ..layers import EncoderConfig
from ..models.encoder import TransformerEncoder
from .tensors import CheckpointTensors
from ..models.classifier import EncoderClassifier
from ..models.decoder.causal_lm import DecoderForCausalLM
from .encoders import build_from_checkpoint_config
from ..models.image_text import ImageTextModel
from ..models.masked_lm import EncoderForMaskedLM

__all__ = [
    "LoadedModel",
    "MODEL_FILE",
    "CONFIG_FILE",
    "TOKENIZER_FILE",
    "model_config",
    "build_model",
    "save_model",
    "load_model",
    "read_checkpoint",
    "is_attnlab_config",
    "is_decoder_config",
    "resolve_checkpoint_dir",
    "find_checkpoint_dir",
    "run_checkpoint",
]

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
_MODEL_TYPES = {cls.model_type: cls for cls in (EncoderClassifier, EncoderForMaskedLM, ImageTextModel)}
_ENCODER_TYPE = "encoder"
_DECODER_TYPE = DecoderForCausalLM.model_type
_ARCHITECTURE_KEYS = ("encoder", "decoder")  # an attnlab config.json holds one of them
_PRETRAINED_KEY = "pretrained_config"


class LoadedModel(NamedTuple):
    """``(model, tokenizer, config)``: the model in eval mode, its ``tokenizers.Tokenizer``
    (``None`` when none was saved) and the ``config.json`` dict."""

    model: nn.Module
    tokenizer: Any
    config: dict


def _unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module


def model_config(model: nn.Module) -> dict[str, Any]:
    """The JSON-able dict that rebuilds ``model``'s architecture."""
    model = _unwrap(model)
    if isinstance(model, TransformerEncoder):
        config = {"model_type": _ENCODER_TYPE, "encoder": model.config.to_dict(), "head": {}}
        return _with_pretrained(config, model)
    if isinstance(model, DecoderForCausalLM):
        return _with_pretrained({"model_type": _DECODER_TYPE, "decoder": model.config.to_dict()}, model)
    model_type = getattr(model, "model_type", None)
    if model_type not in _MODEL_TYPES:
        raise TypeError(
            f"model must be a TransformerEncoder, a DecoderForCausalLM or one of {sorted(_MODEL_TYPES)}, "
            f"got {type(model).__name__}"
        )
    encoder = model.encoder
    config = {"model_type": model_type, "encoder": encoder.config.to_dict(), "head": model.head_config()}
    return _with_pretrained(config, encoder)


def _with_pretrained(config: dict[str, Any], encoder: nn.Module) -> dict[str, Any]:
    """``config`` plus the HF ``config.json`` of a model opened from a pretrained family."""
    pretrained = getattr(encoder, "checkpoint_config", None)
    return config if pretrained is None else {**config, _PRETRAINED_KEY: pretrained}


def is_attnlab_config(config: Any) -> bool:
    """Whether a ``config.json`` dict is attnlab's own (an ``"encoder"`` or ``"decoder"`` entry)."""
    return isinstance(config, dict) and any(key in config for key in _ARCHITECTURE_KEYS)


def is_decoder_config(config: dict[str, Any]) -> bool:
    """Whether an attnlab ``config.json`` dict describes a decoder (else an encoder model)."""
    return config.get("model_type") == _DECODER_TYPE and "decoder" in config


def build_model(config: dict[str, Any], *, device=None, dtype=None) -> nn.Module:
    """A freshly initialised model from a ``config.json`` dict: the ``from_config`` of the
    class its ``model_type`` names (the one protocol every model class follows), given the
    dict. A pretrained family's encoder (the dict keeps its HuggingFace config) is built
    here with the family's components and handed to the task model."""
    if is_decoder_config(config):
        return DecoderForCausalLM.from_config(config, device=device, dtype=dtype)
    for key in ("model_type", "encoder"):
        if key not in config:
            raise ValueError(f"model config has no {key!r} key; got keys {sorted(config)}")
    model_type = config["model_type"]
    if model_type != _ENCODER_TYPE and model_type not in _MODEL_TYPES:
        raise ValueError(f"unknown model_type {model_type!r}; known: {sorted(_MODEL_TYPES) + [_ENCODER_TYPE]}")
    if model_type == ImageTextModel.model_type:  # builds its own text encoder
        return ImageTextModel.from_config(config, device=device, dtype=dtype)
    if not config.get(_PRETRAINED_KEY):
        model_class = TransformerEncoder if model_type == _ENCODER_TYPE else _MODEL_TYPES[model_type]
        return model_class.from_config(config, device=device, dtype=dtype)
    # a family's components, rebuilt from its HF config
    encoder = build_from_checkpoint_config(config[_PRETRAINED_KEY], EncoderConfig.from_dict(config["encoder"]),
                                           device=device, dtype=dtype)
    if model_type == _ENCODER_TYPE:
        return encoder
    return _MODEL_TYPES[model_type].from_config(config, encoder=encoder, device=device, dtype=dtype)


def save_model(model: nn.Module, directory: Union[str, Path], *, tokenizer: Any = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` (and ``tokenizer.json``) into ``directory``.

    Not atomic by itself; :mod:`attnlab.train.checkpoint` wraps it in temp + rename.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = _unwrap(model)
    config = model_config(model)
    # save_model (not save_file) handles tied weights such as the masked-LM decoder
    safetensors.torch.save_model(model, str(directory / MODEL_FILE), metadata={"format": "pt"})
    follow_umask(directory / MODEL_FILE)
    write_json(directory / CONFIG_FILE, config)
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_FILE))
    return directory


def run_checkpoint(path: Path) -> Optional[Path]:
    """A run directory's best (else last) checkpoint, if it has one."""
    for name in ("best", "last", "last.1", "last.2"):  # last.N: older versions, when a save was cut short
        candidate = path / "checkpoints" / name
        if (candidate / MODEL_FILE).is_file():
            return candidate
    return None


def resolve_checkpoint_dir(path: Union[str, Path]) -> Path:
    """The checkpoint directory meant by ``path``: itself, or a run's best (else last) checkpoint."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no model at {path}: the path does not exist")
    if (path / MODEL_FILE).is_file():
        return path
    checkpoint = run_checkpoint(path)
    if checkpoint is not None:
        return checkpoint
    raise FileNotFoundError(
        f"{path} is neither a checkpoint directory (with {MODEL_FILE}) nor a run directory "
        f"(with checkpoints/best or checkpoints/last)"
    )


def _find_tokenizer(checkpoint: Path) -> Optional[Path]:
    for candidate in (checkpoint / TOKENIZER_FILE, checkpoint.parent.parent / TOKENIZER_FILE):
        if candidate.is_file():
            return candidate
    return None


def read_checkpoint(
    checkpoint: Path, config: dict[str, Any], *, device=None, dtype=None, tokenizer: bool = True
) -> LoadedModel:
    """The model (and tokenizer) of an attnlab checkpoint directory whose ``config.json``
    was read already (by :func:`attnlab.checkpoints.source.open_source`).

    Args:
        checkpoint: the checkpoint directory (a run's ``checkpoints/best``, say).
        config: its ``config.json`` dict.
        device: where to put the model.
        dtype: the parameters' dtype, as :func:`~attnlab.checkpoints.tensors.resolve_dtype`
            gives it (``"auto"``: the dtype the file stores).
        tokenizer: also read ``tokenizer.json`` (the checkpoint's, else its run's).

    Returns:
        :class:`LoadedModel` ``(model, tokenizers.Tokenizer or None, config)``, the model in
        eval mode.
    """
    if dtype == "auto":
        dtype = CheckpointTensors.open(checkpoint).stored_dtype() or torch.get_default_dtype()
    model = build_model(config, device=device, dtype=dtype)
    missing, unexpected = load_safetensors_into(model, checkpoint / MODEL_FILE, strict=False,
                                                device=str(device or "cpu"))
    if missing or unexpected:
        raise ValueError(
            f"{checkpoint / MODEL_FILE} does not match its {CONFIG_FILE}: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    backend = None
    tokenizer_path = _find_tokenizer(checkpoint) if tokenizer else None
    if tokenizer_path is not None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tokenizer_path))
    return LoadedModel(model.eval(), backend, config)


# load_model(path, *, device=None, dtype=None): attnlab.load for attnlab's layout, defined with it
# find_checkpoint_dir reads config.json: it lives with the one reader (checkpoints/source.py)
__getattr__ = loader_aliases(__name__, ("load_model", "find_checkpoint_dir"))
