"""``attnlab.load``: one loader for every model attnlab opens, in Python as on the command line.

It sits above both doors. What a path holds is looked at once
(:func:`~attnlab.checkpoints.source.open_source`), then:

* attnlab's runs and checkpoints, and the HuggingFace checkpoints of the families attnlab
  re-implements (encoders, GPT-2 / Llama-family decoders, GGUF files, packaged names) open
  through :func:`attnlab.checkpoints.loading.load`, attnlab's own models;
* any other HuggingFace directory (Gemma 3, Qwen3, T5, ViT, Whisper, ...) opens through
  transformers with attnlab's attention function serving it
  (:func:`attnlab.hf.opening.open_transformers`): the model is a
  :class:`~attnlab.hf.opening.TransformersModel`, called as attnlab's models are.

Both give ``(model, tokenizer, config)``; both models offer the inspection protocol
(:mod:`attnlab.inspect.compute.inspectable`).

A model larger than a device opens with accelerate's ``device_map`` (and ``max_memory``,
``offload_dir``): every HuggingFace directory then opens through transformers, those of
the families attnlab re-implements included (:mod:`attnlab.hf.placement`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

import torch

from .checkpoints import loading as _attnlab_formats
from .checkpoints.attnlab_layout import LoadedModel
from .checkpoints.source import Source, open_source
from .checkpoints.tensors import DtypeLike, resolve_dtype

if TYPE_CHECKING:
    from .hf.placement import Placement

__all__ = ["load"]

# resolve_dtype's answers, as open_transformers names them
_TRANSFORMERS_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", "auto": "auto"}


def load(
    path_or_name: Union[str, Path, Source],
    *,
    device=None,
    dtype: DtypeLike = None,
    tokenizer: bool = True,
    task: str = "auto",
    strict: bool = True,
    dropout: Optional[float] = None,
    attention_dropout: Optional[float] = None,
    device_map: Union[None, str, Mapping[str, Any]] = None,
    max_memory: Union[None, str, Mapping[Any, Any]] = None,
    offload_dir: Union[None, str, Path] = None,
) -> LoadedModel:
    """Open an attnlab run or checkpoint, a HuggingFace directory, a GGUF file or a packaged name.

    Everything :func:`attnlab.checkpoints.loading.load` opens opens the same way (see its
    arguments); a HuggingFace directory of a ``model_type`` attnlab does not re-implement
    opens through transformers, served by attnlab's attention function, in ``dtype``
    (``"float32"`` by default, ``"bfloat16"``, ``"float16"``, ``"auto"``) on ``device``.
    Its tokenizer is ``tokenizer.json``'s (``None`` when there is none: image and speech
    models), its config the transformers config.

    A model larger than a device: ``device_map``, ``max_memory`` and ``offload_dir`` open a
    HuggingFace directory through transformers and accelerate, **whatever its family**: a
    Llama or BERT directory, which opens as attnlab's own model otherwise, then opens as a
    :class:`~attnlab.hf.opening.TransformersModel` too. Each layer runs where the map put
    it, served by attnlab's attention function; recorded weights come back on the CPU.
    attnlab runs and checkpoints, GGUF files and packaged GGUF names open whole and refuse
    these options.

    Args:
        device_map: ``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"`` or
            ``{module name: device}`` (accelerate's); ``max_memory`` or ``offload_dir`` alone
            mean ``"auto"``. Not with ``device``.
        max_memory: each device's budget, ``{"cpu": "300MB"}`` or ``{0: "20GiB", "cpu": "30GiB"}``
            (bytes, or sizes with KB/MB/GB, powers of 10, or KiB/MiB/GiB, powers of 2); what
            does not fit goes to disk.
        offload_dir: the folder for the layers put on disk, new or empty (a user's files are
            never written over); needed whenever the map puts layers on disk.

    Raises:
        FileNotFoundError: no such path or name, or nothing attnlab knows there.
        ImportError: a transformers directory, and transformers is not installed; a device
            map, and accelerate is not installed (``pip install 'attnlab[big]'``).
        ValueError: an encoder option (``task``, ``strict``, ``dropout``) for a model opened
            through transformers, a bad ``dtype``, or a directory transformers cannot read;
            a bad ``device_map`` or ``max_memory``, ``device`` with ``device_map``, an
            ``offload_dir`` that holds files or cannot be written, layers put on disk without
            an ``offload_dir``, or a placement for an attnlab checkpoint or GGUF file.

    Example:
        >>> model, tokenizer, config = attnlab.load("path/to/qwen3")   # through transformers
        >>> ids = tokenizer(["attention is all you need"], return_tensors="pt")["input_ids"]
        >>> with model.record(layers=["layer_2"]) as seen:
        ...     model(ids)
        >>> seen.attentions["layer_2"].shape                          # [1, H, T, T]
        >>> big = attnlab.load("path/to/llama", max_memory={"cpu": "2GiB"}, offload_dir="offload")
    """
    resolved = resolve_dtype(dtype)  # a bad value is refused before anything is read
    from .hf.placement import placement as checked_placement, refuse_unplaceable

    placed = checked_placement(device_map, max_memory, offload_dir, device=device)
    source = path_or_name if isinstance(path_or_name, Source) else open_source(path_or_name)
    from .hf.opening import is_transformers_only

    if placed is not None:
        refuse_unplaceable(source)
    if placed is None and not is_transformers_only(source):
        return _attnlab_formats.load(source, device=device, dtype=dtype, tokenizer=tokenizer, task=task,
                                     strict=strict, dropout=dropout, attention_dropout=attention_dropout)
    options = {"task": task, "strict": strict, "dropout": dropout, "attention_dropout": attention_dropout}
    defaults = _attnlab_formats.ENCODER_DEFAULTS
    given = [f"{key}={value!r}" for key, value in options.items() if value != defaults[key]]
    if given:
        why = "with device_map" if placed is not None else f"(model_type {source.config.get('model_type')!r})"
        raise ValueError(f"{', '.join(given)}: options of the encoders attnlab re-implements; {source.name} opens "
                         f"through transformers {why}: leave them out")
    return _open_with_transformers(source, device=device, dtype=resolved, tokenizer=tokenizer, placement=placed)


def _open_with_transformers(source: Source, *, device: Any, dtype: Union[torch.dtype, str],
                            tokenizer: bool, placement: Optional["Placement"] = None) -> LoadedModel:
    from .checkpoints.encoders.loading import load_tokenizer
    from .data.tokenizer import Tokenizer
    from .hf.opening import open_transformers

    if source.gguf is not None:  # an architecture attnlab does not re-implement: transformers' GGUF reader
        from .hf.opening import gguf_tokenizer

        model = open_transformers(source.gguf.parent, dtype=_TRANSFORMERS_DTYPES[dtype], gguf_file=source.gguf.name)
    else:
        model = open_transformers(source.directory, dtype=_TRANSFORMERS_DTYPES[dtype], placement=placement)
    if device is not None:
        model.to(device)
    backend = None
    if tokenizer and source.gguf is not None:
        backend = gguf_tokenizer(source.gguf)
    elif tokenizer:
        try:
            backend = load_tokenizer(source.directory)  # tokenizer.json, padding and truncation off
        except FileNotFoundError:
            backend = None  # an image or speech model: no text to tokenize
    opened = None
    if backend is not None:
        limit = getattr(model.config, "max_position_embeddings", None)
        options: dict[str, Any] = {"model_max_length": limit if isinstance(limit, int) and limit > 0 else None}
        if model.is_causal:  # a decoder pads on the left, as attnlab's own decoders do
            pad = next((value for value in (getattr(model.config, "pad_token_id", None),
                                            getattr(model.config, "eos_token_id", None)) if isinstance(value, int)), None)
            options.update(padding_side="left", pad_token=None if pad is None else backend.id_to_token(pad))
        opened = Tokenizer(backend, **options)
    return LoadedModel(model, opened, model.config)
