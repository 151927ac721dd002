"""Find the model and tokenizer that ``--model`` names: a run, a checkpoint, a pretrained dir or name.

Everything goes through :func:`attnlab.load` (one loader, one set of rules): an attnlab
run or checkpoint directory, a HuggingFace directory, a ``.gguf`` file, or a packaged name
such as ``minilm`` or ``smollm2``; every command that takes ``--model`` takes what
``attnlab.load`` takes. A HuggingFace directory of an architecture attnlab does not
re-implement (Gemma 3, Qwen3, T5, ...) opens through ``transformers`` under attnlab's
attention function (:mod:`attnlab.hf`). The loaders are imported only when used. Every
command that loads a model takes ``--dtype`` (float32 by default, :data:`DEFAULT_DTYPE`) and
prints the dtype it used in one line (:mod:`attnlab.cli._model_options`), and ``--device-map``,
``--max-memory``, ``--offload-dir``: a :class:`~attnlab.hf.placement.Placement`, with which a
HuggingFace directory of any family opens through transformers, its layers where the map puts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from torch import nn

from .._moved import moved_names

if TYPE_CHECKING:
    from ..hf.placement import Placement

__all__ = ["DEFAULT_DTYPE", "ResolvedModel", "max_length_for", "open_vision_model", "resolve_model"]

DEFAULT_DTYPE = "float32"


@dataclass
class ResolvedModel:
    """A model ready to inspect.

    Attributes:
        model: the ``nn.Module`` (called as ``model(input_ids, mask=...)``).
        tokenizer: an :class:`attnlab.data.Tokenizer` (wraps a ``tokenizers.Tokenizer``).
        name: what ``--model`` said.
        source: ``"run"``, ``"checkpoint"``, ``"pretrained"`` or ``"transformers"``.
        dtype: what ``--dtype`` asked for (``"auto"``: the checkpoint's own).
    """

    model: nn.Module
    tokenizer: Any
    name: str
    source: str
    dtype: str = DEFAULT_DTYPE

    @property
    def is_encoder_decoder(self) -> bool:
        """Whether the model is an encoder-decoder (T5, BART, Marian, Whisper)."""
        return bool(getattr(getattr(self.model, "config", None), "is_encoder_decoder", False))

    def refuse_encoder_decoder(self, reads: str, instead: str) -> None:
        """One line for a command that reads one sequence's attention, given an encoder-decoder:
        its encoder, decoder and cross-attention have no single token axis to share."""
        if self.is_encoder_decoder:
            raise ValueError(f"{self.name} is an encoder-decoder model (encoder, decoder and cross-attention over "
                             f"two texts); {reads}: {instead}")


def resolve_model(spec: str, *, dtype: str = DEFAULT_DTYPE,
                  placement: Optional["Placement"] = None) -> ResolvedModel:
    """Load the model and tokenizer ``spec`` names (see the module docstring), in ``dtype``
    (``--dtype``: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``); with a
    ``placement`` (``--device-map``), a HuggingFace directory of any family opens through
    transformers, its layers where the map puts them.

    Raises:
        FileNotFoundError: ``spec`` is a path that does not exist.
        ValueError: when nothing can be loaded from ``spec``, or ``placement`` is given for an
            attnlab run or checkpoint or a GGUF file; the message says why.
    """
    path = Path(spec)
    if not path.exists() and (os.sep in spec or spec.startswith(".")):
        raise FileNotFoundError(f"--model {spec!r}: no such file or directory")
    from ..hf.opening import is_transformers_only
    from ..checkpoints.tensors import resolve_dtype

    resolve_dtype(dtype, argument="--dtype")  # a bad value is refused before anything is read
    from ..checkpoints.loading import load
    from ..checkpoints.source import open_source

    found = open_source(spec)  # looked at once: load (or transformers) is handed what was read
    if placement is not None:
        from ..hf.placement import refuse_unplaceable

        refuse_unplaceable(found, placement.names)
        return _resolve_transformers(spec, dtype, placement, found.directory)
    if is_transformers_only(found) and found.gguf is not None:  # transformers' GGUF reader (Gemma 3, ...)
        from ..loading import load as load_any

        loaded = load_any(found, dtype=dtype)
        print(f"{spec}: {loaded.model.architecture} from a GGUF file through transformers, attention served by "
              f"attnlab (exact weights where asked, fused sdpa elsewhere)")
        return ResolvedModel(loaded.model, loaded.tokenizer, spec, "transformers", dtype)
    if is_transformers_only(found):
        return _resolve_transformers(spec, dtype)
    loaded = load(found, dtype=dtype)
    if loaded.tokenizer is None:
        raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one")
    source = {"attnlab-run": "run", "attnlab-checkpoint": "checkpoint"}.get(found.format, "pretrained")
    return ResolvedModel(loaded.model, loaded.tokenizer, spec, source, dtype)


def directory_config(spec: str) -> Optional[dict]:
    """``spec/config.json`` as a dict, or ``None`` (no such file, not JSON, not an object):
    a glance at what a directory holds; the loader says what is wrong with it."""
    from .._files import read_json

    try:
        config = read_json(Path(spec) / "config.json")
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _refuse_other_modalities(spec: str) -> None:
    """One line for a speech or image model given to a command that reads text (transformers'
    own error, or a traceback, came instead): which option reads what the model takes."""
    config = directory_config(spec)
    if config is None:
        return
    name = (config.get("architectures") or [config.get("model_type", "model")])[0]
    if "num_mel_bins" in config:
        raise ValueError(f"{spec} is a speech model ({name}): its encoder reads audio, not text; "
                         f"attnlab inspect --model {spec} --audio CLIP.wav draws its attention, attnlab align "
                         f"--model {spec} --audio CLIP.wav --out WORDS.json times its words")
    text = "vocab_size" in config or "text_config" in config
    if not text and ("patch_size" in config or "image_size" in config):
        raise ValueError(f"{spec} is an image model ({name}): it reads pictures, not text; give --image "
                         f"(inspect, explain) or --images (analyze)")


def _resolve_transformers(spec: str, dtype: str, placement: Optional["Placement"] = None,
                          directory: Optional[Path] = None) -> ResolvedModel:
    """``spec`` (or the ``directory`` it names: a packaged name's) through transformers."""
    from ..hf.opening import open_transformers
    from ..hf.placement import describe_map, is_dispatched
    from ..checkpoints.encoders.loading import load_tokenizer

    where = str(directory) if directory is not None else spec
    _refuse_other_modalities(where)
    try:
        tokenizer = load_tokenizer(where)
    except FileNotFoundError:
        raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one") from None
    model = open_transformers(where, dtype=dtype, placement=placement)
    limit = getattr(model.config, "max_position_embeddings", None)
    tokenizer.model_max_length = limit if isinstance(limit, int) and limit > 0 else None
    print(f"{spec}: {type(model.model).__name__} through transformers, attention served by attnlab "
          f"(exact weights where asked, fused sdpa elsewhere)")
    if is_dispatched(model.model):
        print(f"device map: {describe_map(model.model)}")
    return ResolvedModel(model, tokenizer, spec, "transformers", dtype)


def max_length_for(resolved: ResolvedModel, requested: Optional[int], *, fallback: int) -> int:
    """The token budget a command uses: ``--max-length`` if given (refused past the model's
    limit), else the model's own limit, else ``fallback`` (models without one, e.g. rotary).

    Raises:
        ValueError: ``requested`` is below 2 or above what the model takes.
    """
    limit = getattr(resolved.tokenizer, "model_max_length", None)
    if requested is None:
        return limit if limit is not None else fallback
    if requested < 2:
        raise ValueError(f"--max-length must be at least 2 (room for [CLS] and [SEP]), got {requested}")
    if limit is not None and requested > limit:
        raise ValueError(
            f"--max-length {requested} is more than {resolved.name} takes ({limit} positions); "
            f"pass --max-length {limit} or less, or leave it out"
        )
    return requested


def open_vision_model(spec: str, *, flag: str, takes: str, dtype: str, resized: bool = False,
                      placement: Optional["Placement"] = None) -> tuple[Any, Any]:
    """The transformers vision model in directory ``spec`` and its image preprocessing
    (``None``: ViT's defaults), for the commands that take ``flag`` (``--image``,
    ``--images``); prints which preprocessing serves. ``takes`` says which directories the
    flag takes, for the refusal. ``resized``: ``--image-size`` replaces the model's size and crop.
    ``placement``: accelerate's device map (``--device-map``).

    Raises:
        ValueError: ``spec`` is not a transformers model directory.
    """
    from ..data.images import read_image_preprocessing
    from ..hf.opening import is_transformers_only, open_transformers

    if not Path(spec).is_dir() or not is_transformers_only(spec):
        raise ValueError(f"{flag} takes a transformers {takes}; {spec} is not one")
    model = open_transformers(spec, dtype=dtype, placement=placement)
    preprocessing = read_image_preprocessing(spec)
    if preprocessing is None:
        print("preprocessing: no preprocessor_config.json in the model directory; ViT's defaults "
              "(the model's image_size, bicubic, mean and std 0.5)")
    else:
        print("preprocessing: the model directory's preprocessor_config.json"
              + (" (resized to --image-size instead of its size and crop)" if resized else ""))
    return model, preprocessing


__getattr__ = moved_names(__name__)  # MODEL_HELP, add_dtype_argument, dtype_line: attnlab.cli._model_options
