"""HuggingFace GPT-2 checkpoints: config and tensor names, both ways.

``transformer.wte`` / ``wpe`` (token and learned position embeddings),
``transformer.h.{i}.ln_1`` / ``ln_2`` (LayerNorm, pre-norm), ``attn.c_attn`` (Q, K, V
packed in one ``Conv1D``), ``attn.c_proj``, ``mlp.c_fc`` / ``mlp.c_proj``,
``transformer.ln_f``; the LM head is tied to ``wte`` unless ``tie_word_embeddings`` is
false. ``Conv1D`` stores its weight as ``[in, out]``, the transpose of ``nn.Linear``'s.
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from ...layers.decoder_config import DecoderConfig
from .._convert import Plan, read_layout, write_layout
from ..errors import UnsupportedCheckpointError
from ._llama_layout import first_id, hf_activation, hf_activation_name

__all__ = ["decoder_config_from_gpt2", "decoder_state_to_gpt2", "gpt2_config_from_decoder",
           "gpt2_state_to_decoder", "gpt2_tensor_names"]

_PREFIX = "transformer."
# HF name (without "transformer.") -> attnlab name, outside the layers
_TOP = {"wte.weight": "embed_tokens.weight", "wpe.weight": "embed_positions.weight",
        "ln_f.weight": "norm.weight", "ln_f.bias": "norm.bias"}
# HF module -> attnlab module, inside layer i ("h.{i}." -> "layers.{i}.")
_LAYER = {"ln_1": "attn_norm", "ln_2": "ffn_norm", "attn.c_attn": "self_attn.qkv_proj",
          "attn.c_proj": "self_attn.o_proj", "mlp.c_fc": "feed_forward.linear1",
          "mlp.c_proj": "feed_forward.linear2"}
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# DecoderConfig settings every GPT-2 has: read into each config, required of one written as GPT-2
_FIXED = {"norm": "layer", "feed_forward": "plain", "position": "learned", "qkv_bias": True, "out_bias": True,
          "ffn_bias": True}


def gpt2_tensor_names(config: DecoderConfig) -> Plan:
    """``(HF names without "transformer.", attnlab name, stored transposed)`` for every
    tensor but the LM head: the one table both directions read."""
    names: Plan = [((hf,), ours, False) for hf, ours in _TOP.items()]
    for i in range(config.num_layers):
        for hf, ours in _LAYER.items():
            for leaf in ("weight", "bias"):
                transposed = hf in _CONV1D and leaf == "weight"
                names.append(((f"h.{i}.{hf}.{leaf}",), f"layers.{i}.{ours}.{leaf}", transposed))
    return names


def decoder_config_from_gpt2(raw: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """The :class:`DecoderConfig` of a GPT-2 ``config.json``."""
    if raw.get("model_type") != "gpt2":
        raise UnsupportedCheckpointError(f"{source}: model_type {raw.get('model_type')!r} is not 'gpt2'")
    if raw.get("scale_attn_weights", True) is False:
        raise UnsupportedCheckpointError(f"{source}: scale_attn_weights=False is not supported")
    d_model = raw.get("n_embd", raw.get("hidden_size"))
    return DecoderConfig(
        vocab_size=raw["vocab_size"],
        d_model=d_model,
        num_layers=raw.get("n_layer", raw.get("num_hidden_layers")),
        num_heads=raw.get("n_head", raw.get("num_attention_heads")),
        d_ff=raw.get("n_inner") or 4 * d_model,
        max_len=raw.get("n_positions", 1024),
        norm_eps=raw.get("layer_norm_epsilon", 1e-5),
        activation=hf_activation(raw.get("activation_function", "gelu_new"), source),
        **_FIXED,
        scale_by_layer=bool(raw.get("scale_attn_by_inverse_layer_idx", False)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", True)),
        pad_id=first_id(raw.get("pad_token_id")),
        bos_id=first_id(raw.get("bos_token_id")),
        eos_id=first_id(raw.get("eos_token_id")),
    )


def gpt2_config_from_decoder(config: DecoderConfig) -> dict[str, Any]:
    """A GPT-2 ``config.json`` that :func:`decoder_config_from_gpt2` reads back as ``config``.

    Raises:
        UnsupportedCheckpointError: a setting GPT-2 cannot express (all named, one line).
    """
    problems = [f"{name}={getattr(config, name)!r} (GPT-2: {want!r})"
                for name, want in {**_FIXED, "sliding_window": None}.items() if getattr(config, name) != want]
    if config.kv_heads != config.num_heads:
        problems.append(f"num_kv_heads={config.num_kv_heads} (GPT-2 has one key and value per head)")
    if config.attention_head_dim * config.num_heads != config.d_model:
        problems.append(f"head_dim={config.head_dim} (GPT-2: d_model / num_heads)")
    if problems:
        raise UnsupportedCheckpointError(f"this decoder cannot be written as GPT-2: {'; '.join(problems)}")
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_embd": config.d_model,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.d_ff,
        "n_positions": config.max_len,
        "layer_norm_epsilon": config.norm_eps,
        "activation_function": hf_activation_name(config.activation),
        "scale_attn_by_inverse_layer_idx": config.scale_by_layer,
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }


def gpt2_state_to_decoder(tensors: Mapping[str, Tensor], config: DecoderConfig,
                          source: str = "model.safetensors") -> dict[str, Tensor]:
    """attnlab's state dict from GPT-2 tensors (``transformer.`` prefix optional), through
    the one converter (:func:`~attnlab.checkpoints._convert.read_layout`).

    Raises:
        UnsupportedCheckpointError: missing or unexpected tensors, all listed.
    """
    # Old checkpoints carry the causal mask as buffers (attn.bias, attn.masked_bias).
    return read_layout(tensors, gpt2_tensor_names(config), prefix=_PREFIX, tie_embeddings=config.tie_embeddings,
                       ignored=("attn.bias", "attn.masked_bias"), source=source)


def decoder_state_to_gpt2(state: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """GPT-2 tensors (``GPT2LMHeadModel``'s names) from attnlab's state dict: the inverse
    of :func:`gpt2_state_to_decoder`; ``lm_head.weight`` only when the head is not tied."""
    return write_layout(state, gpt2_tensor_names(config), prefix=_PREFIX, tie_embeddings=config.tie_embeddings,
                        split=lambda tensor: (tensor,))
