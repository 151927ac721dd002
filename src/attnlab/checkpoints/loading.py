"""One door for every model attnlab opens: :func:`load`.

``load(path_or_name)`` looks at what it is given once
(:func:`~attnlab.checkpoints.source.open_source`: the format, encoder or decoder, an
encoder's family; the ``config.json`` read once) and hands what it read to the format's
reader:

* an attnlab **run directory** (``attnlab train --out DIR``: ``checkpoints/best`` or
  ``checkpoints/last``) or an attnlab **checkpoint directory** (``model.safetensors`` and
  a ``config.json`` with an ``"encoder"`` or ``"decoder"`` entry) ->
  :func:`~attnlab.checkpoints.attnlab_layout.read_checkpoint`;
* a **HuggingFace encoder** directory (``config.json`` with HuggingFace's ``model_type``)
  or a packaged name such as ``"minilm"`` -> :func:`~attnlab.checkpoints.encoders.loading.read_encoder`;
* a **decoder**: a GPT-2 / Llama / Mistral / Qwen2 directory, a ``.gguf`` file or the
  packaged ``"smollm2"`` -> :func:`~attnlab.checkpoints.decoders.loading.read_decoder`.

It returns ``(model, tokenizer, config)`` with the model in eval mode and the tokenizer as
an HF-callable :class:`~attnlab.data.tokenizer.Tokenizer`. The other doors are aliases of
it, with the same rules and errors: ``Class.from_pretrained(path)`` (:func:`load_as`),
:func:`from_pretrained` (a HuggingFace encoder or decoder, with the encoder's fine-tuning
options), :func:`load_model` (attnlab's layout, its raw ``tokenizers.Tokenizer``),
:func:`load_decoder` (a decoder only) and ``build_encoder(pretrained=...)``;
``model.save_pretrained(dir)`` is :func:`save`.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from .._pretrained_io import register_loader

from ..data.tokenizer import Tokenizer
from ..models.encoder import TransformerEncoder, find_encoder
from ..models.classifier import EncoderClassifier
from ..models.decoder.causal_lm import DecoderForCausalLM
from ..models.masked_lm import EncoderForMaskedLM
from .errors import UnsupportedCheckpointError
from .tensors import DtypeLike, resolve_dtype
from .decoders.loading import read_decoder
from .decoders.saving import check_decoder_weights, save_decoder_pretrained
from .encoders.loading import load_tokenizer, pretrained_dir, read_encoder, save_pretrained
from .attnlab_layout import LoadedModel, read_checkpoint, save_model
from .source import FORMATS, Source, open_source
from .source import find_checkpoint_dir, pretrained_width  # noqa: F401  (the format modules' old names, loader_aliases)

__all__ = [
    "FORMATS",
    "Source",
    "detect_format",
    "from_pretrained",
    "is_decoder_source",
    "load",
    "load_as",
    "load_decoder",
    "load_model",
    "load_tokenizer",
    "open_source",
    "pretrained_dir",
    "save",
]

PathLike = Union[str, Path]
# the HuggingFace encoders' options at their defaults: any other value is refused for other models
ENCODER_DEFAULTS = {"task": "auto", "strict": True, "dropout": None, "attention_dropout": None}


def detect_format(path_or_name: PathLike) -> str:
    """Which kind of model ``path_or_name`` holds: one of :data:`FORMATS`
    (:func:`~attnlab.checkpoints.source.open_source`'s ``format``).

    Raises:
        FileNotFoundError: no such path (and not a packaged name), or a directory holding
            no model attnlab knows; the message says what was found.
    """
    return open_source(path_or_name).format


def is_decoder_source(source: PathLike) -> bool:
    """Whether ``source`` holds a decoder (``False`` too when it holds no model at all)."""
    try:
        return open_source(source).is_decoder
    except (FileNotFoundError, ValueError):
        return False


def load(
    path_or_name: Union[PathLike, Source],
    *,
    device=None,
    dtype: DtypeLike = None,
    tokenizer: bool = True,
    task: str = "auto",
    strict: bool = True,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
) -> LoadedModel:
    """Open an attnlab run or checkpoint, or a HuggingFace directory, GGUF file or packaged name.

    Args:
        path_or_name: a directory or file (see the module docstring), a name such as
            ``"minilm"`` or ``"smollm2"``, or a :class:`~attnlab.checkpoints.source.Source`
            that :func:`~attnlab.checkpoints.source.open_source` returned.
        device: where to put the model.
        dtype: the parameters' dtype: ``"float32"`` (the default: torch's default dtype),
            ``"bfloat16"``, ``"float16"`` (or those torch dtypes), or ``"auto"``: the
            checkpoint's own (the dtype most of its safetensors values are stored in, else
            its ``config.json``'s ``dtype`` / ``torch_dtype``; float32 for a GGUF file).
            HuggingFace checkpoints (one ``model.safetensors`` or the shards of
            ``model.safetensors.index.json``) are read and converted one tensor at a
            time, so loading takes about the model's size in ``dtype``.
        tokenizer: also open the tokenizer; with ``False`` the result's tokenizer is ``None``.
        task: a HuggingFace encoder only: ``"auto"`` (a ``*ForSequenceClassification``
            checkpoint gives an :class:`~attnlab.EncoderClassifier` with its ``id2label`` as
            ``label_names``, a ``*ForMaskedLM`` one an :class:`~attnlab.EncoderForMaskedLM`,
            anything else the encoder), ``"encoder"``, ``"sequence_classification"`` or
            ``"masked_lm"``.
        strict: a HuggingFace encoder only: with ``False``, tensors nothing has a place for
            (a task head, ``cls.*``) are skipped instead of raising.
        dropout: a HuggingFace encoder only: replaces the checkpoint's dropout (for fine-tuning).
        attention_dropout: a HuggingFace encoder only: replaces its attention-probability
            dropout; 0 keeps the fused attention kernel during fine-tuning, which is faster.

    Returns:
        :class:`~attnlab.checkpoints.attnlab_layout.LoadedModel` ``(model, tokenizer, config)``:
        the model in eval mode, a callable :class:`~attnlab.data.tokenizer.Tokenizer`
        (``None`` when the directory has none; a decoder's pads on the left), and the
        directory's ``config.json`` dict (a GGUF file's: its ``DecoderConfig`` as a dict).

    Raises:
        FileNotFoundError: no such path or name, or nothing attnlab knows there (see
            :func:`~attnlab.checkpoints.source.open_source`).
        UnsupportedCheckpointError: a checkpoint attnlab cannot read; every problem is listed.
        ValueError: a bad ``dtype``, or an encoder option given for another kind of model.

    Example:
        >>> model, tokenizer, _ = attnlab.load("minilm")
        >>> out = model(**tokenizer(["attention is all you need"], return_tensors="pt"))
    """
    dtype = resolve_dtype(dtype)
    source = open_source(path_or_name)
    options = {"task": task, "strict": strict, "dropout": dropout, "attention_dropout": attention_dropout}
    if source.is_attnlab or source.is_decoder:
        given = [f"{key}={value!r}" for key, value in options.items() if value != ENCODER_DEFAULTS[key]]
        if given:
            kind = "a decoder" if source.is_decoder else "an attnlab checkpoint"
            raise ValueError(f"{', '.join(given)}: options of HuggingFace encoders; {source.name} holds {kind}")
    if source.is_attnlab:
        model, backend, config = read_checkpoint(source.directory, source.config, device=device, dtype=dtype,
                                                 tokenizer=tokenizer)
    elif source.is_decoder:
        model, backend = read_decoder(source.directory, source.config, source.gguf, device=device, dtype=dtype,
                                      tokenizer=tokenizer)
        config = model.config.to_dict() if source.config is None else copy.deepcopy(source.config)
    else:
        model = read_encoder(source.directory, source.config, source.family, device=device, dtype=dtype, **options)
        config = copy.deepcopy(source.config)  # the model keeps its own (checkpoint_config)
        backend = _encoder_tokenizer(source.directory) if tokenizer else None
    if backend is None:
        return LoadedModel(model, None, config)
    if source.is_decoder:
        return LoadedModel(model, _decoder_tokenizer(model, backend), config)
    return LoadedModel(model, Tokenizer(backend, **_tokenizer_options(model)), config)


def _encoder_tokenizer(directory: Path) -> Any:
    try:
        return load_tokenizer(directory)
    except FileNotFoundError:
        return None


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
    model = load(path_or_name, device=device, dtype=dtype, tokenizer=False).model
    if isinstance(model, cls):
        return model
    encoder = find_encoder(model, ("encoder", "text_encoder"))
    if cls is TransformerEncoder and encoder is not None:
        return encoder
    raise TypeError(
        f"{path_or_name} holds a {type(model).__name__}, not a {cls.__name__}; open it with "
        f"{type(model).__name__}.from_pretrained(...) or attnlab.load(...)"
    )


def from_pretrained(
    name_or_path: PathLike,
    *,
    task: str = "auto",
    strict: bool = True,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
    device: Optional[Union[str, torch.device]] = None,
    dtype: DtypeLike = None,
) -> Union[TransformerEncoder, EncoderClassifier, EncoderForMaskedLM, DecoderForCausalLM]:
    """:func:`load`'s model, for a HuggingFace checkpoint (an encoder of a supported family,
    a GPT-2 / Llama / Mistral / Qwen2 decoder, a GGUF file, ``"minilm"``, ``"smollm2"``).

    The arguments are :func:`load`'s; the tokenizer is not opened (see
    :func:`~attnlab.checkpoints.encoders.loading.load_tokenizer`).

    Raises:
        UnsupportedCheckpointError: an attnlab run or checkpoint (open it with :func:`load`),
            or a checkpoint attnlab cannot read (every problem listed).
        FileNotFoundError: no such directory or files, or the package for a known
            name is missing (the message names the install command).
    """
    source = open_source(name_or_path)
    if source.format == "attnlab-run":
        raise UnsupportedCheckpointError(
            f"{name_or_path} is an attnlab run directory, not a HuggingFace one; open it with "
            f"attnlab.load({str(name_or_path)!r}) or attnlab.checkpoints.load_model(...)"
        )
    if source.format == "attnlab-checkpoint":
        raise UnsupportedCheckpointError(
            f"{source.directory} is an attnlab checkpoint (model_type {source.config.get('model_type')!r}), not a "
            f"HuggingFace one; open it with attnlab.load({str(name_or_path)!r}) or attnlab.checkpoints.load_model(...)"
        )
    if source.is_decoder:  # the encoder's options do not apply (and were never refused here)
        return load(source, device=device, dtype=dtype, tokenizer=False).model
    return load(source, device=device, dtype=dtype, tokenizer=False, task=task, strict=strict, dropout=dropout,
                attention_dropout=attention_dropout).model


def load_model(path: PathLike, *, device=None, dtype: DtypeLike = None) -> LoadedModel:
    """:func:`load` for attnlab's own run and checkpoint directories, with the tokenizer as
    the ``tokenizers.Tokenizer`` it wraps.

    Args:
        path: a checkpoint directory (``model.safetensors`` + ``config.json``) or a run
            directory, whose ``checkpoints/best`` (else ``checkpoints/last``) is used.
        device: where to put the model.
        dtype: as :func:`load`'s.

    Returns:
        :class:`LoadedModel` ``(model, tokenizers.Tokenizer or None, config)`` with the model in eval mode.

    Raises:
        ValueError: a HuggingFace directory or GGUF file (open it with :func:`load`).
    """
    source = open_source(path)
    if not source.is_attnlab:
        what = ("a GGUF file" if source.config is None
                else f"a HuggingFace checkpoint (model_type {source.config.get('model_type')!r})")
        raise ValueError(f"{source.where} is {what}, not an attnlab one; open it with "
                         f"attnlab.load({str(path)!r}) or attnlab.from_pretrained(...)")
    model, tokenizer, config = load(source, device=device, dtype=dtype)
    return LoadedModel(model, None if tokenizer is None else tokenizer.backend, config)


def load_decoder(source: PathLike, *, device=None, dtype: DtypeLike = None) -> DecoderForCausalLM:
    """:func:`load`'s model, for a decoder: a HuggingFace GPT-2 / Llama / Mistral / Qwen2
    directory, a ``.gguf`` file, ``"smollm2"``, or a decoder saved in attnlab's layout.

    Raises:
        UnsupportedCheckpointError: ``source`` holds an encoder.
    """
    found = open_source(source)
    if not found.is_decoder:
        raise UnsupportedCheckpointError(f"{found.where} holds an encoder, not a decoder; open it with "
                                         f"attnlab.load({str(source)!r})")
    return load(found, device=device, dtype=dtype, tokenizer=False).model


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
            or Qwen2 layout; see :mod:`attnlab.checkpoints.decoders.saving`).
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


# Class.from_pretrained and save_pretrained call load_as and save; the format modules below hand
# out from_pretrained, load_model, load_decoder and is_decoder_source under their old paths
register_loader(sys.modules[__name__])
