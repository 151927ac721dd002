"""Gemma 3 270M as a HuggingFace directory, written from the model attnlab opened from its
GGUF file (transformers cannot save a model it read from GGUF: its weights are copied into
a model built from the same config), and random models of the same config."""

from __future__ import annotations

from pathlib import Path

import torch

VERSION = "1.0.0-c1"  # the packages' version, and the layout written (bump to rebuild the cache)


def plain_config(loaded_model):
    """The transformers config of a model read from GGUF, without its GGUF quantization entry."""
    import transformers

    values = loaded_model.model.config.to_dict()
    values.pop("quantization_config", None)
    return transformers.AutoConfig.for_model(**values)


def write_directory(loaded, directory: Path) -> None:
    """Save ``(model, tokenizer, config)`` of the GGUF file as ``config.json``,
    ``model.safetensors`` and ``tokenizer.json`` in ``directory``."""
    import transformers

    model, tokenizer, _ = loaded
    plain = transformers.AutoModelForCausalLM.from_config(plain_config(model))
    plain.load_state_dict(model.model.state_dict())
    plain.save_pretrained(directory)
    tokenizer.backend.save(str(directory / "tokenizer.json"))


def random_gemma(loaded_model, seed: int = 0):
    """A ``TransformersModel`` of the same config with transformers' random initialisation."""
    import transformers

    from attnlab.hf.opening import TransformersModel

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(plain_config(loaded_model), attn_implementation="sdpa")
    return TransformersModel(model.eval(), name="random Gemma 3")
