"""HuggingFace Llama-family checkpoints (Llama, Mistral, Qwen2, SmolLM): config and tensor names.

``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm`` / ``post_attention_layernorm`` (RMSNorm), ``model.norm``, ``lm_head``
(absent when tied to ``model.embed_tokens``). Queries, keys and values are packed into
attnlab's one ``qkv_proj`` in that order.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ...layers.decoder_config import DecoderConfig
from .._bert_layout import UnsupportedCheckpointError

__all__ = ["LLAMA_MODEL_TYPES", "decoder_config_from_llama", "llama_state_to_decoder", "hf_activation",
           "first_id"]

LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2")

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def hf_activation(name: str, source: str) -> str:
    """attnlab's name for HuggingFace's activation ``name``."""
    if name not in _ACTIVATIONS:
        raise UnsupportedCheckpointError(f"{source}: activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def first_id(value: Any) -> Optional[int]:
    """A token id from a config field that may hold one id or a list of them."""
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _rope(raw: dict[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """``(theta, scaling)`` from a v4 config (``rope_theta`` + ``rope_scaling``) or a v5 one
    (``rope_parameters``)."""
    parameters = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(parameters.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    return theta, (None if rope_type == "default" else parameters)


def decoder_config_from_llama(raw: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """The :class:`DecoderConfig` of a Llama, Mistral or Qwen2 ``config.json``.

    Raises:
        UnsupportedCheckpointError: a setting attnlab does not implement (named).
    """
    model_type = raw.get("model_type")
    if model_type not in LLAMA_MODEL_TYPES:
        raise UnsupportedCheckpointError(f"{source}: model_type {model_type!r} is not one of {LLAMA_MODEL_TYPES}")
    theta, scaling = _rope(raw)
    if float(raw.get("partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise UnsupportedCheckpointError(f"{source}: partial_rotary_factor != 1 is not supported")
    sliding_window = None
    if model_type == "mistral":
        sliding_window = raw.get("sliding_window")
    elif model_type == "qwen2" and raw.get("use_sliding_window"):
        raise UnsupportedCheckpointError(f"{source}: Qwen2's per-layer sliding window (use_sliding_window) "
                                         f"is not supported")
    attention_bias = bool(raw.get("attention_bias", False))
    return DecoderConfig(
        vocab_size=raw["vocab_size"],
        d_model=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=raw["num_attention_heads"],
        d_ff=raw["intermediate_size"],
        num_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        head_dim=raw.get("head_dim") or None,
        max_len=raw.get("max_position_embeddings", 2048),
        norm="rms",
        norm_eps=raw.get("rms_norm_eps", 1e-6),
        feed_forward="gated",
        activation=hf_activation(raw.get("hidden_act", "silu"), source),
        position="rotary",
        rope_theta=theta,
        rope_scaling=scaling,
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        out_bias=attention_bias if model_type == "llama" else False,
        ffn_bias=bool(raw.get("mlp_bias", False)),
        sliding_window=sliding_window,
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),  # HuggingFace's default for all three
        pad_id=first_id(raw.get("pad_token_id")),
        bos_id=first_id(raw.get("bos_token_id")),
        eos_id=first_id(raw.get("eos_token_id")),
    )


def llama_state_to_decoder(tensors: dict[str, Tensor], config: DecoderConfig,
                           source: str = "model.safetensors") -> dict[str, Tensor]:
    """attnlab's state dict from HuggingFace Llama-family tensors (``model.`` prefix optional).

    Raises:
        UnsupportedCheckpointError: missing or unexpected tensors, all listed.
    """
    prefix = "model." if any(name.startswith("model.") for name in tensors) else ""
    remaining = dict(tensors)
    missing: list[str] = []

    def take(name: str, required: bool = True) -> Optional[Tensor]:
        tensor = remaining.pop(name, None)
        if tensor is None and required:
            missing.append(name)
        return tensor

    state: dict[str, Tensor] = {"embed_tokens.weight": take(f"{prefix}embed_tokens.weight"),
                                "norm.weight": take(f"{prefix}norm.weight")}
    for i in range(config.num_layers):
        hf, ours = f"{prefix}layers.{i}.", f"layers.{i}."
        state[ours + "attn_norm.weight"] = take(hf + "input_layernorm.weight")
        state[ours + "ffn_norm.weight"] = take(hf + "post_attention_layernorm.weight")
        q, k, v = (take(hf + f"self_attn.{name}_proj.weight") for name in "qkv")
        if q is not None and k is not None and v is not None:
            state[ours + "self_attn.qkv_proj.weight"] = torch.cat((q, k, v))  # [(H + 2K) * D, E]
        if config.qkv_bias:
            biases = [take(hf + f"self_attn.{name}_proj.bias") for name in "qkv"]
            if all(b is not None for b in biases):
                state[ours + "self_attn.qkv_proj.bias"] = torch.cat(biases)  # [(H + 2K) * D]
        state[ours + "self_attn.o_proj.weight"] = take(hf + "self_attn.o_proj.weight")
        if config.out_bias:
            state[ours + "self_attn.o_proj.bias"] = take(hf + "self_attn.o_proj.bias")
        for name in ("gate", "up", "down"):
            state[ours + f"feed_forward.{name}_proj.weight"] = take(hf + f"mlp.{name}_proj.weight")
            if config.ffn_bias:
                state[ours + f"feed_forward.{name}_proj.bias"] = take(hf + f"mlp.{name}_proj.bias")
    head = take("lm_head.weight", required=not config.tie_embeddings)
    if head is not None and not config.tie_embeddings:
        state["lm_head.weight"] = head
    unexpected = sorted(name for name in remaining if not name.endswith("rotary_emb.inv_freq"))
    if missing or unexpected:
        raise UnsupportedCheckpointError(f"{source}: missing tensors {missing}; unexpected tensors {unexpected}")
    return {name: tensor for name, tensor in state.items() if tensor is not None}
