"""Decoding steps as one compiled graph: ``generate(..., compile=True)``.

A decoding step of a small model on a CPU is mostly spent on matters other than its
matrix products: a few hundred small operations, each paying Python's and torch's
dispatch, and each slowed further by the caches the weight stream just flushed. On a
2-core AVX-512 machine a step of a 12-layer, width-768 Llama takes 25 ms in eager mode
where its matrix products take 17-19 ms. Compiled by ``torch.compile`` (inductor, with its
C++ wrapper so that the compiled step is called without Python in between) over a
cache of fixed size, the step takes about the time of its products. For float32 models
up to 8 sequences, ``generate``'s default native step (:mod:`.native_decoding`) does the
same without compiling, and faster.

The step reuses the model's own modules (embeddings, norms, projections, feed-forward
nets, rotary angles); only attention is written here: the new key and value go into slot
``s`` of the cache, the query attends to every slot with a mask (real tokens up to ``s``,
within the sliding window), so every step has the same shapes and compiles once per batch
size, cache size (rounded up to :data:`CAPACITY_STEP`) and weight capture. Compiling costs
seconds to a minute on the first call (torch keeps compiled code on disk for later
processes), so it pays for long generations or repeated ones. Past torch's limit of
compiled variants of one function (8) the step runs uncompiled, correct but slower.
Module hooks would not run inside the step, so models with hooks are refused
(:func:`check_no_hooks`).

Dimension letters: ``B`` batch, ``H`` query heads, ``K`` key/value heads, ``C`` cache
slots, ``D`` head dim, ``E`` model dim, ``V`` vocabulary.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from ...attention.interface import head_scale_of
from ...attention.rotary import apply_rotary
from ...layers.kv_cache import KVCache
from ...outputs import LayerAttentions
from .step_slots import StepSlots

__all__ = ["CAPACITY_STEP", "CompiledDecoding", "check_no_hooks", "compiled_capacity"]

CAPACITY_STEP = 256
"""Cache sizes are rounded up to a multiple of this, so that calls of similar lengths share
one compiled step."""


def compiled_capacity(length: int) -> int:
    """The cache size a compiled generation of ``length`` positions uses."""
    return -(-length // CAPACITY_STEP) * CAPACITY_STEP


def check_no_hooks(model) -> None:
    """Refuse a model whose modules have forward hooks, a head mask or another attention
    function set, or a ``forward`` set on the module itself: compiled steps call submodules
    directly, so hooks (and patched forwards) on the model, its layers or their attention
    would not run, nor would the attention function that applies the head mask."""
    from torch.nn.modules import module as module_globals

    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        raise ValueError("compile=True does not run module hooks, and global forward hooks are set: "
                         "generate without compile=True")
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            raise ValueError(
                f"compile=True does not run module hooks, and {name or 'the model'} has forward hooks "
                "(mask_heads, capture_attention or your own): generate without compile=True"
            )
        if getattr(module, "attn_implementation", "sdpa") != "sdpa" or head_scale_of(module) is not None:
            raise ValueError(
                f"compile=True does not run module hooks or attention functions, and {name or 'the model'} has a "
                "head mask or another attention function set (mask_heads, an inspection block or your own): "
                "generate without compile=True"
            )
        if "forward" in vars(module):
            raise ValueError(f"compile=True may not run {name or 'the model'}'s forward, set on the module "
                             "itself: generate without compile=True")


def _decode_step(model, tokens: Tensor, positions: Tensor, slot: Tensor, allowed: Tensor,
                 keys: list[Tensor], values: list[Tensor], need_weights: bool):
    """One token per row through ``model``, writing its keys and values into slot ``slot``.

    ``tokens`` / ``positions`` ``[B]``, ``slot`` ``[1]``, ``allowed`` ``[B, C]`` bool,
    ``keys`` / ``values`` per layer ``[B, K, C, D]`` (written in place) -> logits ``[B, V]``
    and, with ``need_weights``, per layer ``[B, H, C]`` weights.
    """
    x = model.embed_tokens(tokens)  # [B, E]
    if model.embed_positions is not None:
        x = x + model.embed_positions(positions)
    rotary = None if model.rotary is None else model.rotary(positions[:, None], x.dtype)  # ([B, 1, D],) x 2
    bias = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill_(~allowed, float("-inf"))
    B, C = allowed.shape
    weights = []
    for layer, key_store, value_store in zip(model.layers, keys, values):
        attention = layer.self_attn
        H, K, D = attention.num_heads, attention.num_kv_heads, attention.head_dim
        qkv = attention.qkv_proj(layer.attn_norm(x)).view(B, H + 2 * K, 1, D)
        query, key, value = qkv.split((H, K, K), dim=1)  # [B, H, 1, D], [B, K, 1, D] x 2
        if rotary is not None:
            query, key = apply_rotary(query, *rotary), apply_rotary(key, *rotary)
        key_store.index_copy_(2, slot, key)
        value_store.index_copy_(2, slot, value)
        scale = attention.scale if attention.scale is not None else D ** -0.5
        grouped = query.reshape(B, K, H // K, D)  # a group's query heads are rows of its key/value head
        scores = torch.matmul(grouped, key_store.transpose(-1, -2)) * scale  # [B, K, H/K, C]
        scores = scores + bias[:, None, None]
        probabilities = scores.softmax(-1)
        attended = torch.matmul(probabilities, value_store).reshape(B, H * D)  # [B, H*D]
        x = x + attention.o_proj(attended)
        x = x + layer.feed_forward(layer.ffn_norm(x))
        if need_weights:
            weights.append(probabilities.reshape(B, H, C))
    return model.lm_head(model.norm(x)), weights


@functools.cache
def _compiled_step():
    return torch.compile(_decode_step, dynamic=False, options={"cpp_wrapper": True})


class CompiledDecoding:
    """The decoding steps of one ``generate`` call, after its eager prompt pass.

    Args:
        model: the :class:`~attnlab.models.decoder.DecoderForCausalLM`.
        cache: the cache the prompt pass filled, allocated with
            :func:`compiled_capacity` slots (its storage is written in place).
        keep: ``[B, T]`` keep mask of the prompt (``None``: no padding).
        need_weights: record each step's per-layer, per-head weights.
    """

    def __init__(self, model, cache: KVCache, keep: Tensor | None, need_weights: bool) -> None:
        self.model = model
        # the model's layers, which may be fewer than its config's (a truncated model)
        self.keys, self.values = zip(*(cache.storage(layer) for layer in range(len(model.layers))))
        B, _, capacity, _ = self.keys[0].shape
        length = len(cache)
        for store in (*self.keys, *self.values):
            # Every slot is attended with a mask: a free slot's weight is 0, and 0 times the
            # NaN an uninitialised slot may hold would still be NaN.
            store[:, :, length:].zero_()
        self.slots = StepSlots(model, B, capacity, length, keep, self.keys[0].device)
        self.need_weights = need_weights
        self.compiled = False

    def __call__(self, tokens: Tensor) -> tuple[Tensor, LayerAttentions | None]:
        """Tokens ``[B]`` -> next-token logits ``[B, 1, V]`` and, with weights on, each
        layer's ``[B, H, 1, S]`` weights over the positions so far."""
        slots = self.slots
        slot = slots.next_slot()
        slot_index = torch.tensor([slot], device=slots.allowed.device)
        try:
            logits, weights = _compiled_step()(self.model, tokens, slots.positions, slot_index, slots.allowed,
                                               list(self.keys), list(self.values), self.need_weights)
        except Exception as error:  # torch.compile reports a missing C++ toolchain and the like
            if self.compiled:
                raise
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RuntimeError(
                f"compile=True: the first compiled decoding step failed ({first_line}); "
                "generate without compile=True"
            ) from error
        self.compiled = True
        slots.step_done()
        attentions = None
        if self.need_weights:
            # copies of the S used slots, so that the recorded rows do not hold all C
            attentions = LayerAttentions([layer[:, :, None, : slot + 1].contiguous() for layer in weights])
        return logits[:, None], attentions
