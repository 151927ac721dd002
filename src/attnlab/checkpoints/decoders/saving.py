"""A decoder written back in its HuggingFace layout, which ``transformers`` opens.

GPT-2 (``Conv1D`` weights transposed back, Q, K, V packed in ``c_attn``, the LM head tied
unless ``tie_word_embeddings`` is false) and Llama, Mistral, Qwen2 (``qkv_proj`` split back
into ``q_proj``, ``k_proj``, ``v_proj``), through the same name tables the loader reads. A
decoder opened from a HuggingFace directory keeps that ``config.json``
(``checkpoint_config``): it is written in that family, its keys kept. Any other decoder (a
GGUF file, one built from a :class:`DecoderConfig`) gets a ``config.json`` built from its
config: GPT-2 for learned positions, else Llama, Mistral (a sliding window) or Qwen2
(biases on q, k, v only). Weights are written in the model's dtype (a GGUF model's are
dequantised float32). attnlab's own layout is :func:`attnlab.checkpoints.attnlab_layout.save_model`'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Union

from torch import Tensor

from ..._files import follow_umask, write_json
from ..errors import UnsupportedCheckpointError
from ._gpt2_layout import decoder_state_to_gpt2, gpt2_config_from_decoder
from ._llama_layout import LLAMA_MODEL_TYPES, decoder_state_to_llama, first_id, llama_config_from_decoder
from ...models.decoder.causal_lm import DecoderForCausalLM
from .loading import DECODER_MODEL_TYPES, decoder_config_from_hf

__all__ = ["check_decoder_weights", "decoder_to_hf", "save_decoder_pretrained"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")


Writers = tuple[Callable[..., dict[str, Any]], Callable[..., dict[str, Tensor]]]


def _writers(model_type: Optional[str]) -> Writers:
    """``(config writer, tensor writer)`` of a family; ``None``: a Llama-family one, chosen by the config."""
    if model_type == "gpt2":
        return gpt2_config_from_decoder, decoder_state_to_gpt2
    if model_type is None or model_type in LLAMA_MODEL_TYPES:
        return (lambda config: llama_config_from_decoder(config, model_type)), decoder_state_to_llama
    raise UnsupportedCheckpointError(
        f"no HuggingFace writer for model_type {model_type!r}; "
        f"attnlab writes {', '.join(DECODER_MODEL_TYPES)}"
    )


def check_decoder_weights(model: DecoderForCausalLM) -> None:
    """Check that ``model``'s tensors still fit its config, which every reader rebuilds it from.

    Raises:
        ValueError: a tensor of another shape (a resized embedding, say) or an LM head tied
            or untied against ``config.tie_embeddings``; the problems on one line.
    """
    config = model.config
    expected = {name: tuple(tensor.shape)
                for name, tensor in DecoderForCausalLM(config, device="meta").state_dict().items()}
    actual = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    problems = [f"{name} is {actual.get(name)}, its config builds {shape}"
                for name, shape in expected.items() if actual.get(name) != shape]
    problems += [f"{name} is not in a model of its config" for name in sorted(set(actual) - set(expected))]
    tied = model.lm_head.weight is model.embed_tokens.weight
    if tied != config.tie_embeddings:
        problems.append(f"config.tie_embeddings is {config.tie_embeddings} but the LM head is "
                        f"{'tied to' if tied else 'apart from'} the token embedding")
    if problems:
        raise ValueError(
            f"this decoder no longer fits its config, so it would not reopen: {'; '.join(problems)}")


def _config_values(model: DecoderForCausalLM) -> dict[str, Any]:
    """The ``config.json`` to write: the original's, updated where attnlab's config differs."""
    config = model.config
    original = model.checkpoint_config
    if original:
        model_type = original.get("model_type")
    else:  # learned positions: GPT-2; rotary: the Llama family, chosen by the config
        model_type = "gpt2" if config.position == "learned" else None
    write_config, _ = _writers(model_type)
    fresh = write_config(config)
    if not original:
        values = fresh
    elif decoder_config_from_hf(original) == config:
        values = dict(original)  # unchanged: every key kept as it was
    else:
        values = {**original, **fresh}
        for key in _IDS:  # keep lists (several EOS ids, as Llama 3's) whose first id is unchanged
            if key in original and first_id(original[key]) == fresh[key]:
                values[key] = original[key]
    values["architectures"] = fresh["architectures"]
    dtype = str(model.embed_tokens.weight.dtype).removeprefix("torch.")
    for key in [key for key in ("torch_dtype", "dtype") if key in values] or ["torch_dtype"]:
        values[key] = dtype  # what the tensors hold: transformers loads in this dtype
    read_back = decoder_config_from_hf(values)
    if read_back != config:
        differing = [field.name for field in dataclasses.fields(config)
                     if getattr(read_back, field.name) != getattr(config, field.name)]
        raise UnsupportedCheckpointError(
            f"this decoder cannot be written as {values['model_type']}: its config.json would read back "
            f"with other {differing}"
        )
    return values


def decoder_to_hf(model: DecoderForCausalLM) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, tensors)`` of ``model`` in its HuggingFace layout (see the module docstring).

    Raises:
        UnsupportedCheckpointError: the model cannot be expressed in that layout (the reason, one line).
    """
    if not isinstance(model, DecoderForCausalLM):
        raise TypeError(f"model must be a DecoderForCausalLM, got {type(model).__name__}")
    check_decoder_weights(model)
    values = _config_values(model)
    _, write_tensors = _writers(values["model_type"])
    tensors = write_tensors(model.state_dict(), model.config)
    # clones: q, k and v are views of one tensor, which safetensors refuses to write
    return values, {name: tensor.detach().cpu().contiguous().clone() for name, tensor in tensors.items()}


def _tokenizer_config(model: DecoderForCausalLM, tokenizer: Any) -> dict[str, Any]:
    """A ``tokenizer_config.json`` that names the special tokens of the config's ids, so that
    ``transformers.AutoTokenizer`` knows them; a chat template is not known here, so not written."""
    values: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "padding_side": "left",
                              "model_max_length": model.config.max_len}
    for key, token_id in (("bos_token", model.config.bos_id), ("eos_token", model.config.eos_id),
                          ("pad_token", model.config.pad_id)):
        token = None if token_id is None else tokenizer.id_to_token(token_id)
        if token is not None:
            values[key] = token
    return values


def save_decoder_pretrained(model: DecoderForCausalLM, directory: Union[str, Path],
                            tokenizer: Any = None) -> Path:
    """Write ``model`` in its HuggingFace layout: ``config.json`` and ``model.safetensors`` that
    ``transformers.AutoModelForCausalLM.from_pretrained(directory)`` opens.

    Args:
        model: a decoder, e.g. from :func:`~attnlab.checkpoints.decoders.loading.load_decoder`.
        directory: created if needed; existing files of the same names are replaced.
        tokenizer: a ``tokenizers.Tokenizer``, saved as ``tokenizer.json`` with a
            ``tokenizer_config.json`` naming its BOS, EOS and pad tokens (no chat template).

    Returns:
        The directory.

    Raises:
        UnsupportedCheckpointError: the model cannot be expressed in the layout (why, one line).
        ValueError: its tensors no longer fit its config.
    """
    values, tensors = decoder_to_hf(model)  # everything checked before anything is written
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / CONFIG_FILE, values)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    follow_umask(directory / WEIGHTS_FILE)
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_FILE))
        write_json(directory / TOKENIZER_CONFIG_FILE, _tokenizer_config(model, tokenizer))
    return directory
