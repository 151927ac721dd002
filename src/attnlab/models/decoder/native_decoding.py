"""Decoding steps as one native call: ``generate``'s default steps.

A decoding step of a small model on a CPU spends much of its time outside its matrix
products: about 35 small torch operations per layer, each paying Python's and torch's
dispatch. On a 2-core Intel Xeon running torch's AVX2 kernels, a step of a 12-layer,
width-768 Llama took 22 ms in eager mode: 15 ms of products, 3 ms of other operations,
about 4 ms of Python. ``_native/decode_step.cpp`` runs the whole step (every layer's
norms, products by the few-row kernel, rotary positions, the cache write, attention, the
feed-forward net, then the final norm and the LM head) in one call, so that a step takes
about the time of its products, without the compilation ``compile=True`` needs.

It serves every decoder attnlab builds (the Llama family: RMSNorm, SwiGLU, rotary
positions; GPT-2: LayerNorm, a plain GELU net, learned positions, biases) in float32, bfloat16 or
float16 on the CPU, for batches the few-row kernel takes (up to :data:`attnlab._skinny.MAX_ROWS` rows),
when no module has forward hooks (the steps do not go through the modules' ``forward``:
``mask_heads`` and ``capture_attention`` keep the module path) and every module is
attnlab's own. :func:`unserved_reason` says why it does not serve a model; ``generate``
then runs the modules, which give the same tokens.

In bfloat16 and float16 the step reads the weight matrices and the cache in the model's
dtype (half the bytes of float32: a step is bounded by reading them) and computes in
float32: the residual stream, the sums of the products, the norms (their weights and the
biases widened once per ``generate`` call), attention. The module path rounds every
operation's result to the model's dtype instead, so the native logits are closer to a
float64 forward of the same weights, and greedy tokens agree except where two logits are
within the dtype's rounding of each other.

Dimension letters: ``B`` batch, ``H`` query heads, ``C`` cache slots, ``S`` positions so
far, ``D`` head dim, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ... import _native
from ..._dispatch import native_unavailable_reason
from ..._precision import Linear
from ..._skinny import MAX_ROWS
from ...layers.causal_attention import CausalSelfAttention
from ...layers.decoder_layer import DecoderLayer
from ...layers.ffn import PositionWiseFFN, SwiGLUFFN, resolve_activation
from ...layers.kv_cache import KVCache
from ...layers.rms_norm import RMSNorm
from ...outputs import LayerAttentions
from .compiled_decoding import check_no_hooks
from .step_slots import StepSlots

__all__ = ["NativeDecoding", "unserved_reason"]

_KERNEL = "decode_step"


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the kernel's weight and cache dtypes
_NORMS = {"rms": 0, "layer": 1}  # the kernel's codes (decode_step.cpp: Norm, Activation)
_ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


def _feed_forward_parts(feed_forward: nn.Module) -> tuple[nn.Module, Optional[nn.Module], nn.Module]:
    """A feed-forward net's (in, gate or ``None``, down) projections: SwiGLU's (up, gate,
    down), a plain net's (linear1, ``None``, linear2)."""
    if isinstance(feed_forward, SwiGLUFFN):
        return feed_forward.up_proj, feed_forward.gate_proj, feed_forward.down_proj
    return feed_forward.linear1, None, feed_forward.linear2


def _module_reason(model) -> Optional[str]:
    """Why the model's modules are not the ones the native step computes, or ``None``."""
    # the class whose forward the model runs (causal_lm imports this module: no import back)
    owner = next(cls for cls in type(model).__mro__ if "forward" in vars(cls))
    if owner.__module__ != f"{__package__}.causal_lm":
        return f"{type(model).__name__} overrides forward"
    config = model.config
    norm_type = RMSNorm if config.norm == "rms" else nn.LayerNorm
    feed_forward_type = SwiGLUFFN if config.feed_forward == "gated" else PositionWiseFFN
    activation = resolve_activation(config.activation)
    for layer in model.layers:
        feed_forward = layer.feed_forward
        parts = (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                 *(part for part in _feed_forward_parts(feed_forward) if part is not None))
        if (type(layer) is not DecoderLayer or type(layer.self_attn) is not CausalSelfAttention
                or type(feed_forward) is not feed_forward_type
                or any(type(norm) is not norm_type for norm in (layer.attn_norm, layer.ffn_norm))
                or any(type(part) is not Linear for part in parts)):
            return "a layer holds modules of other types than attnlab's own"
        if feed_forward.activation is not activation:
            return "a feed-forward net's activation is not its config's"
        if (feed_forward_type is PositionWiseFFN and feed_forward.training
                and (feed_forward.dropout1.p or feed_forward.dropout2.p)):
            return "a feed-forward net has dropout, in training mode"
    if len({(layer.self_attn.num_heads, layer.self_attn.num_kv_heads, layer.self_attn.head_dim)
            for layer in model.layers}) != 1:
        return "the layers differ in heads (pruned heads?)"
    if type(model.norm) is not norm_type or type(model.lm_head) is not Linear:
        return "the final norm or the LM head is not attnlab's own"
    norms = [norm for layer in model.layers for norm in (layer.attn_norm, layer.ffn_norm)] + [model.norm]
    if len({norm.eps for norm in norms}) != 1:
        return "the norms differ in eps"
    if norm_type is nn.LayerNorm and not all(norm.elementwise_affine for norm in norms):
        return "a LayerNorm without weights"
    if model.rotary is not None and model.layers[0].self_attn.head_dim % 2:
        return "rotary positions with an odd head dim"
    first_name, first = next(iter(model.named_parameters()))
    for name, parameter in model.named_parameters():
        if not (parameter.device.type == "cpu" and parameter.is_contiguous()):
            return f"parameter {name} is not a contiguous CPU tensor"
        if parameter.dtype not in _DTYPES:
            return f"parameter {name} is {parameter.dtype}, not float32, bfloat16 or float16"
        if parameter.dtype != first.dtype:
            return f"the parameters mix dtypes: {first_name} is {first.dtype}, {name} {parameter.dtype}"
    return None


def call_reason(batch: int) -> Optional[str]:
    """Why the native step cannot take a call of ``batch`` rows whatever the model, or ``None``:
    past the few-row kernel's rows, or under autocast (whose dtypes the step does not follow)."""
    if not 0 < batch <= MAX_ROWS:
        return f"batch {batch} is past the {MAX_ROWS} rows of the few-row kernel"
    if torch.is_autocast_enabled("cpu"):
        return "autocast is on"
    return None


def unserved_reason(model, batch: int) -> Optional[str]:
    """``None`` where the native step serves ``model``'s decoding at ``batch`` rows, else why not."""
    reason = call_reason(batch)
    if reason is not None:
        return reason
    try:
        check_no_hooks(model)
    except ValueError:
        return "the model has forward hooks, or a forward set on one of its modules"
    reason = _module_reason(model)
    if reason is not None:
        return reason
    return native_unavailable_reason(_KERNEL)


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
        # the model's layers, which may be fewer than its config's (a truncated model)
        keys, values = zip(*(cache.storage(layer) for layer in range(len(model.layers))))
        B, _, capacity, _ = keys[0].shape
        self.slots = StepSlots(model, B, capacity, len(cache), keep, keys[0].device)
        self.need_weights = need_weights
        layers = model.layers
        attention = layers[0].self_attn

        def scale(layer: DecoderLayer) -> float:
            layer_scale = layer.self_attn.scale
            return layer_scale if layer_scale is not None else attention.head_dim ** -0.5

        def widened(parameter: Optional[Tensor]) -> Optional[Tensor]:
            # matrices in the model's dtype, as they are; norms' weights and biases in
            # float32 (a few KiB, widened once; the same tensors in a float32 model)
            return parameter if parameter is None or parameter.dim() == 2 else parameter.float()

        def weight_and_bias(module: Optional[nn.Module]) -> list[Optional[Tensor]]:
            return [None, None] if module is None else [widened(module.weight),
                                                        widened(getattr(module, "bias", None))]

        weights: list[Optional[Tensor]] = []  # decode_step.cpp's Entry order, then the final norm and LM head
        for layer in layers:
            for module in (layer.attn_norm, layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.ffn_norm,
                           *_feed_forward_parts(layer.feed_forward)):
                weights += weight_and_bias(module)
        weights += weight_and_bias(model.norm) + weight_and_bias(model.lm_head)
        config = model.config
        self.arguments = (
            weights, list(keys), list(values),  # the cache is written in place: the kernel checks its layout
            [scale(layer) for layer in layers], attention.num_heads, attention.num_kv_heads,
            _NORMS[config.norm], model.norm.eps, _ACTIVATIONS[config.activation],
        )
        self.kernel = _native.build(_KERNEL)

    def __call__(self, tokens: Tensor) -> tuple[Tensor, Optional[LayerAttentions]]:
        """Tokens ``[B]`` -> next-token logits ``[B, 1, V]`` (float32) and, with weights on, each
        layer's ``[B, H, 1, S]`` weights over the positions so far."""
        model, slots = self.model, self.slots
        slot = slots.next_slot()
        x = model.embed_tokens(tokens)  # [B, E]
        if model.embed_positions is not None:
            x = x + model.embed_positions(slots.positions)
        dtype = x.dtype
        cos = sin = None
        if model.rotary is not None:
            angles = model.rotary(slots.positions[:, None], torch.float32)  # ([B, 1, D],) x 2
            cos, sin = (part[:, 0].contiguous() for part in angles)  # [B, D]
        logits, weights = self.kernel.step(x.float().contiguous(), cos, sin, slots.allowed, slot,
                                           *self.arguments, self.need_weights)
        slots.step_done()
        if not self.need_weights:
            return logits[:, None], None
        # float32 logits (closer to exact than the model's dtype); weights in the model's dtype,
        # like the prompt pass's
        return logits[:, None], LayerAttentions([layer.to(dtype) for layer in weights])

