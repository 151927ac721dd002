"""Decoding steps as one native call: ``generate``'s default steps for Llama-family models.

A decoding step of a small model on a CPU spends much of its time outside its matrix
products: about 35 small torch operations per layer, each paying Python's and torch's
dispatch. On a 2-core Intel Xeon running torch's AVX2 kernels, a step of a 12-layer,
width-768 Llama took 22 ms in eager mode: 15 ms of products, 3 ms of other operations,
about 4 ms of Python. ``_native/decode_step.cpp`` runs the whole step (every layer's
norms, products by the few-row kernel, rotary positions, the cache write, attention, the
SwiGLU net, then the final norm and the LM head) in one call, so that a step takes about
the time of its products, without the compilation ``compile=True`` needs.

It serves models of RMSNorm, SwiGLU (SiLU) and rotary or learned positions (Llama,
Mistral, Qwen2, SmolLM) in float32 on the CPU, for batches the few-row kernel takes (up to
:data:`attnlab._skinny.MAX_ROWS` rows), when no module has forward hooks (the steps do not
go through the modules' ``forward``: ``mask_heads`` and ``capture_attention`` keep the
module path) and every module is attnlab's own. :func:`unserved_reason` says why it does
not serve a model; ``generate`` then runs the modules, which give the same tokens.

Dimension letters: ``B`` batch, ``H`` query heads, ``C`` cache slots, ``S`` positions so
far, ``D`` head dim, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ... import _native
from ..._precision import Linear
from ..._skinny import MAX_ROWS
from ...layers.causal_attention import CausalSelfAttention
from ...layers.decoder_layer import DecoderLayer
from ...layers.ffn import SwiGLUFFN
from ...layers.kv_cache import KVCache
from ...layers.rms_norm import RMSNorm
from ...outputs import LayerAttentions
from .compiled_decoding import check_no_hooks
from .step_slots import StepSlots

__all__ = ["NativeDecoding", "unserved_reason"]

_KERNEL = "decode_step"


def _module_reason(model) -> Optional[str]:
    """Why the model's modules are not the ones the native step computes, or ``None``."""
    # the class whose forward the model runs (causal_lm imports this module: no import back)
    owner = next(cls for cls in type(model).__mro__ if "forward" in vars(cls))
    if owner.__module__ != f"{__package__}.causal_lm":
        return f"{type(model).__name__} overrides forward"
    config = model.config
    if (config.norm, config.feed_forward, config.activation) != ("rms", "gated", "silu"):
        return f"norm={config.norm!r}, feed_forward={config.feed_forward!r}, activation={config.activation!r}"
    expected = {RMSNorm, DecoderLayer, CausalSelfAttention, SwiGLUFFN, Linear}
    for layer in model.layers:
        parts = (layer, layer.attn_norm, layer.ffn_norm, layer.self_attn, layer.feed_forward,
                 layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.feed_forward.gate_proj,
                 layer.feed_forward.up_proj, layer.feed_forward.down_proj)
        if any(type(part) not in expected for part in parts):
            return "a layer holds modules of other types than attnlab's own"
    if len({(layer.self_attn.num_heads, layer.self_attn.num_kv_heads, layer.self_attn.head_dim)
            for layer in model.layers}) != 1:
        return "the layers differ in heads (pruned heads?)"
    if type(model.norm) is not RMSNorm or type(model.lm_head) is not Linear:
        return "the final norm or the LM head is not attnlab's own"
    if len({norm.eps for norm in _norms(model)}) != 1:
        return "the norms differ in eps"
    if model.rotary is not None and model.layers[0].self_attn.head_dim % 2:
        return "rotary positions with an odd head dim"
    for name, parameter in model.named_parameters():
        if not (parameter.dtype == torch.float32 and parameter.device.type == "cpu"
                and parameter.is_contiguous()):
            return f"parameter {name} is not a contiguous float32 CPU tensor"
    return None


def _norms(model) -> list[RMSNorm]:
    return [norm for layer in model.layers for norm in (layer.attn_norm, layer.ffn_norm)] + [model.norm]


def unserved_reason(model, batch: int) -> Optional[str]:
    """``None`` where the native step serves ``model``'s decoding at ``batch`` rows, else why not."""
    if not 0 < batch <= MAX_ROWS:
        return f"batch {batch} is past the {MAX_ROWS} rows of the few-row kernel"
    if torch.is_autocast_enabled("cpu"):
        return "autocast is on"
    try:
        check_no_hooks(model)
    except ValueError:
        return "the model has forward hooks"
    reason = _module_reason(model)
    if reason is not None:
        return reason
    return _native.unavailable_reason(_KERNEL)


class NativeDecoding:
    """The decoding steps of one ``generate`` call, after its prompt pass, as native calls.

    Args:
        model: the :class:`~attnlab.models.decoder.DecoderForCausalLM` (one
            :func:`unserved_reason` found no reason against).
        cache: the cache the prompt pass filled (its storage is written in place; it
            needs room for every step).
        keep: ``[B, T]`` keep mask of the prompt (``None``: no padding).
        need_weights: record each step's per-layer, per-head weights.
    """

    def __init__(self, model, cache: KVCache, keep: Optional[Tensor], need_weights: bool) -> None:
        self.model = model
        keys, values = zip(*(cache.storage(layer) for layer in range(cache.num_layers)))
        B, _, capacity, _ = keys[0].shape
        self.slots = StepSlots(model, B, capacity, len(cache), keep, keys[0].device)
        self.need_weights = need_weights
        layers = model.layers
        attention = layers[0].self_attn

        def scale(layer: DecoderLayer) -> float:
            layer_scale = layer.self_attn.scale
            return layer_scale if layer_scale is not None else attention.head_dim ** -0.5

        def weights(name: str) -> list[Tensor]:
            return [layer.get_submodule(name).weight for layer in layers]

        def biases(name: str) -> list[Optional[Tensor]]:
            return [layer.get_submodule(name).bias for layer in layers]

        self.arguments = (
            weights("attn_norm"), weights("self_attn.qkv_proj"), biases("self_attn.qkv_proj"),
            weights("self_attn.o_proj"), biases("self_attn.o_proj"), weights("ffn_norm"),
            weights("feed_forward.gate_proj"), biases("feed_forward.gate_proj"),
            weights("feed_forward.up_proj"), biases("feed_forward.up_proj"),
            weights("feed_forward.down_proj"), biases("feed_forward.down_proj"),
            list(keys), list(values),  # written in place: the kernel checks they are contiguous
            [scale(layer) for layer in layers], attention.num_heads, attention.num_kv_heads,
            model.norm.eps, model.norm.weight, model.lm_head.weight, model.lm_head.bias,
        )
        self.kernel = _native.build(_KERNEL)

    def __call__(self, tokens: Tensor) -> tuple[Tensor, Optional[LayerAttentions]]:
        """Tokens ``[B]`` -> next-token logits ``[B, 1, V]`` and, with weights on, each
        layer's ``[B, H, 1, S]`` weights over the positions so far."""
        model, slots = self.model, self.slots
        slot = slots.next_slot()
        x = model.embed_tokens(tokens)  # [B, E]
        if model.embed_positions is not None:
            x = x + model.embed_positions(slots.positions)
        cos = sin = None
        if model.rotary is not None:
            angles = model.rotary(slots.positions[:, None], x.dtype)  # ([B, 1, D],) x 2
            cos, sin = (part[:, 0].contiguous() for part in angles)  # [B, D]
        logits, weights = self.kernel.step(x.contiguous(), cos, sin, slots.allowed, slot, *self.arguments,
                                           self.need_weights)
        slots.step_done()
        return logits[:, None], LayerAttentions(weights) if self.need_weights else None

