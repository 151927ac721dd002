"""One loader for every model attnlab opens: :func:`load`.

``load(path_or_name)`` looks at what it is given and opens it:

* an attnlab **run directory** (``attnlab train --out DIR``: ``checkpoints/best`` or
  ``checkpoints/last``) or an attnlab **checkpoint directory** (``model.safetensors`` and
  a ``config.json`` with an ``"encoder"`` entry) -> :func:`~attnlab.models.load_model`;
* a **HuggingFace directory** (``config.json`` with HuggingFace's ``model_type``) or a
  packaged name such as ``"minilm"`` -> :func:`~attnlab.models.pretrained.from_pretrained`;
* a **decoder**: a GPT-2 / Llama / Mistral / Qwen2 directory, a ``.gguf`` file or the
  packaged ``"smollm2"`` -> :func:`~attnlab.models.decoder.loading.load_decoder`; a decoder
  saved in attnlab's layout (a ``"decoder"`` entry) is an attnlab checkpoint.

It returns ``(model, tokenizer, config)`` with the model in eval mode and the tokenizer as
an HF-callable :class:`~attnlab.data.tokenizer.Tokenizer`. The model classes reach this
module through ``Class.from_pretrained(path)`` and ``model.save_pretrained(dir)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from torch import nn

from .._files import check_path_argument, read_json
from ..data.tokenizer import Tokenizer
from ..layers.encoder import TransformerEncoder, find_encoder
from .decoder.causal_lm import DecoderForCausalLM
from .checkpoint_tensors import DtypeLike, resolve_dtype
from .decoder.loading import DECODER_NAMES, is_decoder_source, load_decoder_and_tokenizer
from .decoder.saving import check_decoder_weights, save_decoder_pretrained
from .pretrained import PRETRAINED_NAMES, from_pretrained, load_tokenizer, pretrained_dir, save_pretrained
from .serialization import (
    CONFIG_FILE,
    MODEL_FILE,
    LoadedModel,
    find_checkpoint_dir,
    load_model,
    save_model,
)

__all__ = ["FORMATS", "detect_format", "load", "load_as", "save"]

PathLike = Union[str, Path]
FORMATS = ("attnlab-run", "attnlab-checkpoint", "huggingface")


def detect_format(path_or_name: PathLike) -> str:
    """Which kind of model ``path_or_name`` holds: one of :data:`FORMATS`.

    Raises:
        FileNotFoundError: no such path (and not a packaged name), or a directory holding
            no model attnlab knows; the message says what was found.
    """
    if is_decoder_source(path_or_name):
        return "huggingface"
    if isinstance(path_or_name, str) and path_or_name.lower() in {*PRETRAINED_NAMES, "all-minilm-l6-v2",
                                                                 "sentence-transformers/all-minilm-l6-v2"}:
        return "huggingface"
    path = Path(path_or_name)
    if not path.exists():
        names = ", ".join([*PRETRAINED_NAMES, *DECODER_NAMES])
        raise FileNotFoundError(f"no model at {str(path)!r}: the path does not exist (known names: {names})")
    if path.is_file():
        raise FileNotFoundError(
            f"{path} is a file; pass a .gguf file or the directory that holds {MODEL_FILE} and {CONFIG_FILE}"
        )
    checkpoint = find_checkpoint_dir(path)
    if checkpoint is not None:
        return "attnlab-checkpoint" if checkpoint == path else "attnlab-run"
    config_path = path / CONFIG_FILE
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{config_path}: not valid JSON ({error})") from None
        if isinstance(config, dict) and "model_type" in config:
            return "huggingface"
    raise FileNotFoundError(
        f"{path} holds no model attnlab knows: neither an attnlab run (checkpoints/best or last), an "
        f"attnlab checkpoint ({MODEL_FILE} + {CONFIG_FILE} with an 'encoder' or 'decoder' entry) nor a "
        f"HuggingFace directory ({CONFIG_FILE} with a 'model_type')"
    )


def load(path_or_name: PathLike, *, device=None, dtype: DtypeLike = None) -> LoadedModel:
    """Open an attnlab run or checkpoint, or a HuggingFace directory or packaged name.

    Args:
        path_or_name: a directory (see the module docstring) or a name such as ``"minilm"``.
        device: where to put the model.
        dtype: the parameters' dtype: ``"float32"`` (the default: torch's default dtype),
            ``"bfloat16"``, ``"float16"`` (or those torch dtypes), or ``"auto"``: the
            checkpoint's own (the dtype most of its safetensors values are stored in, else
            its ``config.json``'s ``dtype`` / ``torch_dtype``; float32 for a GGUF file).
            HuggingFace checkpoints (one ``model.safetensors`` or the shards of
            ``model.safetensors.index.json``) are read and converted one tensor at a
            time, so loading takes about the model's size in ``dtype``.

    Returns:
        :class:`~attnlab.models.serialization.LoadedModel` ``(model, tokenizer, config)``:
        the model in eval mode, a callable :class:`~attnlab.data.tokenizer.Tokenizer`
        (``None`` when the directory has none; a decoder's pads on the left), and the
        directory's ``config.json`` dict (a GGUF file's: its ``DecoderConfig`` as a dict).

    Example:
        >>> model, tokenizer, _ = attnlab.load("minilm")
        >>> out = model(**tokenizer(["attention is all you need"], return_tensors="pt"))
    """
    check_path_argument("path_or_name", path_or_name)
    dtype = resolve_dtype(dtype)
    kind = detect_format(path_or_name)
    if is_decoder_source(path_or_name):
        # one reading of a GGUF file serves the weights and the tokenizer
        model, backend = load_decoder_and_tokenizer(path_or_name, device=device, dtype=dtype)
        tokenizer = _decoder_tokenizer(model, backend)
        config_path = Path(path_or_name) / CONFIG_FILE
        config = read_json(config_path) if config_path.is_file() else model.config.to_dict()
        return LoadedModel(model, tokenizer, config)
    if kind in ("attnlab-run", "attnlab-checkpoint"):
        loaded = load_model(path_or_name, device=device, dtype=dtype)
        model, backend, config = loaded
        if isinstance(model, DecoderForCausalLM):
            return LoadedModel(model, _decoder_tokenizer(model, backend), config)
        tokenizer = None if backend is None else Tokenizer(backend, **_tokenizer_options(model))
        return LoadedModel(model, tokenizer, config)
    model = from_pretrained(path_or_name, device=device, dtype=dtype)
    directory = pretrained_dir(path_or_name)
    config = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    try:
        backend = load_tokenizer(path_or_name)
    except FileNotFoundError:
        backend = None
    tokenizer = None if backend is None else Tokenizer(backend, **_tokenizer_options(model))
    return LoadedModel(model, tokenizer, config)


def _decoder_tokenizer(model: DecoderForCausalLM, backend: Any) -> Optional[Tokenizer]:
    """A decoder's tokenizer: it pads on the left, with the pad token (else the EOS token)."""
    if backend is None:
        return None
    pad = model.config.pad_id if model.config.pad_id is not None else model.config.eos_id
    pad_token = None if pad is None else backend.id_to_token(pad)
    return Tokenizer(backend, padding_side="left", pad_token=pad_token)


def _tokenizer_options(model: nn.Module) -> dict[str, Any]:
    encoder = find_encoder(model, ("encoder", "text_encoder"))
    if encoder is None:
        return {}
    config = encoder.config
    limit = config.max_len if config.position in ("sinusoidal", "learned") else None
    return {"model_max_length": limit, "return_token_type_ids": bool(config.type_vocab_size)}


def load_as(cls: type, path_or_name: PathLike, *, device=None, dtype: DtypeLike = None) -> nn.Module:
    """``cls.from_pretrained(path)``: :func:`load`, then make sure the model is a ``cls``.

    A model with an encoder inside opens as a :class:`~attnlab.TransformerEncoder` too
    (the encoder of a fine-tuned classifier, as HuggingFace's base classes do).

    Raises:
        TypeError: the saved model is of another class; the message names it.
    """
    model = load(path_or_name, device=device, dtype=dtype).model
    if isinstance(model, cls):
        return model
    encoder = find_encoder(model, ("encoder", "text_encoder"))
    if cls is TransformerEncoder and encoder is not None:
        return encoder
    raise TypeError(
        f"{path_or_name} holds a {type(model).__name__}, not a {cls.__name__}; open it with "
        f"{type(model).__name__}.from_pretrained(...) or attnlab.load(...)"
    )


def save(
    model: nn.Module, directory: PathLike, *, tokenizer: Any = None, layout: str = "attnlab"
) -> Path:
    """``model.save_pretrained(directory)``.

    Args:
        model: an attnlab model.
        directory: where to write; created if missing. Files of the same names are replaced.
        tokenizer: also write its ``tokenizer.json``.
        layout: ``"attnlab"`` (``model.safetensors`` + ``config.json`` that
            :func:`load` and ``Class.from_pretrained`` open, any attnlab model) or
            ``"huggingface"`` (the family's layout that ``transformers`` opens: an encoder's
            (BERT's for a dense encoder of attnlab's own), a decoder's GPT-2, Llama, Mistral
            or Qwen2 layout; see :mod:`attnlab.models.decoder.saving`).
    """
    if layout not in ("attnlab", "huggingface"):
        raise ValueError(f"layout must be 'attnlab' or 'huggingface', got {layout!r}")
    backend = tokenizer.backend if isinstance(tokenizer, Tokenizer) else tokenizer
    decoder = getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module
    if isinstance(decoder, DecoderForCausalLM):
        if layout == "huggingface":
            return save_decoder_pretrained(decoder, directory, backend)
        check_decoder_weights(decoder)  # load rebuilds it from its config: refuse what would not reopen
    if layout == "attnlab":
        return save_model(model, directory, tokenizer=backend)
    return save_pretrained(model, directory, backend)
