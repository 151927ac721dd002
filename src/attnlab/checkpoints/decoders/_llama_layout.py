"""HuggingFace Llama-family checkpoints (Llama, Mistral, Qwen2, SmolLM): config and tensor names,
both ways.

``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm`` / ``post_attention_layernorm`` (RMSNorm), ``model.norm``, ``lm_head``
(absent when tied to ``model.embed_tokens``). Queries, keys and values are packed into
attnlab's one ``qkv_proj`` in that order, and split back when written.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from torch import Tensor

from ...layers.decoder_config import DecoderConfig
from .._convert import Plan, read_layout, write_layout
from ..errors import UnsupportedCheckpointError

__all__ = ["LLAMA_MODEL_TYPES", "decoder_config_from_llama", "decoder_state_to_llama", "first_id",
           "hf_activation", "hf_activation_name", "llama_config_from_decoder", "llama_state_to_decoder",
           "llama_tensor_names"]

LLAMA_MODEL_TYPES = ("llama", "mistral", "qwen2")

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh"}
_PREFIX = "model."
# HF module -> attnlab module, inside layer i ("layers.{i}." both sides); q, k, v are packed apart
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.o_proj": "self_attn.o_proj", "mlp.gate_proj": "feed_forward.gate_proj",
          "mlp.up_proj": "feed_forward.up_proj", "mlp.down_proj": "feed_forward.down_proj"}


def hf_activation(name: str, source: str) -> str:
    """attnlab's name for HuggingFace's activation ``name``."""
    if name not in _ACTIVATIONS:
        raise UnsupportedCheckpointError(f"{source}: activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def hf_activation_name(name: str) -> str:
    """HuggingFace's name for attnlab's activation ``name`` (the first of its names above)."""
    return next(hf for hf, ours in _ACTIVATIONS.items() if ours == name)


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


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def llama_config_from_decoder(config: DecoderConfig, model_type: Optional[str] = None) -> dict[str, Any]:
    """A Llama, Mistral or Qwen2 ``config.json`` that :func:`decoder_config_from_llama` reads
    back as ``config``.

    Args:
        config: the decoder's configuration.
        model_type: the family to write; by default the one the config calls for (``"mistral"``
            with a sliding window, ``"qwen2"`` with biases on q, k, v only, else ``"llama"``).

    Raises:
        UnsupportedCheckpointError: a setting the family cannot express (all named, one line).
    """
    if model_type is None:
        model_type = ("mistral" if config.sliding_window is not None
                      else "qwen2" if config.qkv_bias and not config.out_bias else "llama")
    if model_type not in LLAMA_MODEL_TYPES:
        raise UnsupportedCheckpointError(f"model_type {model_type!r} is not one of {LLAMA_MODEL_TYPES}")
    wanted: dict[str, Any] = {"norm": "rms", "feed_forward": "gated", "position": "rotary",
                              "scale_by_layer": False}
    if model_type == "llama":
        wanted.update(sliding_window=None, out_bias=config.qkv_bias)  # attention_bias covers q, k, v and o
    elif model_type == "mistral":
        wanted.update(qkv_bias=False, out_bias=False, ffn_bias=False)
    else:
        wanted.update(qkv_bias=True, out_bias=False, ffn_bias=False, sliding_window=None)
    problems = [f"{name}={getattr(config, name)!r} ({model_type}: {value!r})"
                for name, value in wanted.items() if getattr(config, name) != value]
    if problems:
        raise UnsupportedCheckpointError(
            f"this decoder cannot be written as {model_type}: {'; '.join(problems)}")
    rope = {"rope_type": "default"} if config.rope_scaling is None else dict(config.rope_scaling)
    values: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.kv_heads,
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.norm_eps,
        "hidden_act": hf_activation_name(config.activation),
        # both forms: transformers v4 reads rope_theta + rope_scaling, v5 rope_parameters
        "rope_theta": config.rope_theta,
        "rope_scaling": None if config.rope_scaling is None else dict(config.rope_scaling),
        "rope_parameters": {**rope, "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_embeddings,
        "pad_token_id": config.pad_id,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
    }
    if config.head_dim is not None:
        values["head_dim"] = config.head_dim
    if model_type == "llama":
        values.update(attention_bias=config.qkv_bias, mlp_bias=config.ffn_bias)
    elif model_type == "mistral":
        values["sliding_window"] = config.sliding_window
    else:
        values.update(use_sliding_window=False, sliding_window=None)
    return values


def llama_tensor_names(config: DecoderConfig) -> Plan:
    """``(HF names without "model.", attnlab name, stored transposed)`` for every tensor but
    the LM head: the one table both directions read. Three HF names (q, k, v) are one
    attnlab tensor, concatenated in that order."""
    names: Plan = [(("embed_tokens.weight",), "embed_tokens.weight", False), (("norm.weight",), "norm.weight", False)]
    for i in range(config.num_layers):
        layer = f"layers.{i}."
        for hf, ours in _LAYER.items():
            biased = (config.out_bias if hf == "self_attn.o_proj"
                      else config.ffn_bias if hf.startswith("mlp.") else False)
            for leaf in ("weight", "bias") if biased else ("weight",):
                names.append(((f"{layer}{hf}.{leaf}",), f"{layer}{ours}.{leaf}", False))
        for leaf in ("weight", "bias") if config.qkv_bias else ("weight",):
            names.append((tuple(f"{layer}self_attn.{part}_proj.{leaf}" for part in "qkv"),
                          f"{layer}self_attn.qkv_proj.{leaf}", False))
    return names


def llama_state_to_decoder(tensors: Mapping[str, Tensor], config: DecoderConfig,
                           source: str = "model.safetensors") -> dict[str, Tensor]:
    """attnlab's state dict from HuggingFace Llama-family tensors (``model.`` prefix optional),
    through the one converter (:func:`~attnlab.checkpoints._convert.read_layout`): every name
    is checked before any tensor is looked up, and each is looked up once, so a mapping that
    reads on lookup (:class:`~attnlab.checkpoints.tensors.CheckpointTensors`) reads the
    checkpoint one tensor at a time.

    Raises:
        UnsupportedCheckpointError: missing or unexpected tensors, all listed.
    """
    return read_layout(tensors, llama_tensor_names(config), prefix=_PREFIX, tie_embeddings=config.tie_embeddings,
                       ignored=("rotary_emb.inv_freq",), source=source)


def decoder_state_to_llama(state: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """Llama-family tensors (``*ForCausalLM``'s names) from attnlab's state dict: the inverse
    of :func:`llama_state_to_decoder`, ``qkv_proj`` split into q, k and v; ``lm_head.weight``
    only when the head is not tied."""
    H, K, D = config.num_heads, config.kv_heads, config.attention_head_dim
    return write_layout(state, llama_tensor_names(config), prefix=_PREFIX, tie_embeddings=config.tie_embeddings,
                        split=lambda tensor: tensor.split((H * D, K * D, K * D)))
