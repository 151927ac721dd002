"""HuggingFace GPT-2 checkpoints: config and tensor names.

``transformer.wte`` / ``wpe`` (token and learned position embeddings),
``transformer.h.{i}.ln_1`` / ``ln_2`` (LayerNorm, pre-norm), ``attn.c_attn`` (Q, K, V
packed in one ``Conv1D``), ``attn.c_proj``, ``mlp.c_fc`` / ``mlp.c_proj``,
``transformer.ln_f``; the LM head is tied to ``wte``. ``Conv1D`` stores its weight as
``[in, out]``, the transpose of ``nn.Linear``'s.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ...layers.decoder_config import DecoderConfig
from .._bert_layout import UnsupportedCheckpointError
from ._llama_layout import first_id, hf_activation

__all__ = ["decoder_config_from_gpt2", "gpt2_state_to_decoder"]


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
        norm="layer",
        norm_eps=raw.get("layer_norm_epsilon", 1e-5),
        feed_forward="plain",
        activation=hf_activation(raw.get("activation_function", "gelu_new"), source),
        position="learned",
        qkv_bias=True,
        out_bias=True,
        ffn_bias=True,
        scale_by_layer=bool(raw.get("scale_attn_by_inverse_layer_idx", False)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", True)),
        pad_id=first_id(raw.get("pad_token_id")),
        bos_id=first_id(raw.get("bos_token_id")),
        eos_id=first_id(raw.get("eos_token_id")),
    )


def gpt2_state_to_decoder(tensors: dict[str, Tensor], config: DecoderConfig,
                          source: str = "model.safetensors") -> dict[str, Tensor]:
    """attnlab's state dict from GPT-2 tensors (``transformer.`` prefix optional).

    Raises:
        UnsupportedCheckpointError: missing or unexpected tensors, all listed.
    """
    prefix = "transformer." if any(name.startswith("transformer.") for name in tensors) else ""
    remaining = dict(tensors)
    missing: list[str] = []

    def take(name: str, conv1d: bool = False) -> Tensor:
        tensor = remaining.pop(prefix + name, None)
        if tensor is None:
            missing.append(prefix + name)
            return tensor
        return tensor.t().contiguous() if conv1d else tensor  # Conv1D [in, out] -> Linear [out, in]

    state = {"embed_tokens.weight": take("wte.weight"), "embed_positions.weight": take("wpe.weight"),
             "norm.weight": take("ln_f.weight"), "norm.bias": take("ln_f.bias")}
    for i in range(config.num_layers):
        hf, ours = f"h.{i}.", f"layers.{i}."
        for name, ours_name in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm")):
            state[ours + f"{ours_name}.weight"] = take(hf + f"{name}.weight")
            state[ours + f"{ours_name}.bias"] = take(hf + f"{name}.bias")
        for hf_name, ours_name in (("attn.c_attn", "self_attn.qkv_proj"), ("attn.c_proj", "self_attn.o_proj"),
                                   ("mlp.c_fc", "feed_forward.linear1"), ("mlp.c_proj", "feed_forward.linear2")):
            state[ours + f"{ours_name}.weight"] = take(hf + f"{hf_name}.weight", conv1d=True)
            state[ours + f"{ours_name}.bias"] = take(hf + f"{hf_name}.bias")
    head = remaining.pop("lm_head.weight", None)
    if not config.tie_embeddings:
        if head is None:
            missing.append("lm_head.weight")
        state["lm_head.weight"] = head
    # Old checkpoints carry the causal mask as buffers (attn.bias, attn.masked_bias).
    unexpected = sorted(name for name in remaining if not name.endswith(("attn.bias", "attn.masked_bias")))
    if missing or unexpected:
        raise UnsupportedCheckpointError(f"{source}: missing tensors {missing}; unexpected tensors {unexpected}")
    return state
