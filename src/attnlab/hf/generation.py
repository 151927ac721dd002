"""transformers' ``generate`` under attnlab: every step's weights, as attnlab's generation output.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` prompt length, ``S`` positions so far,
``N`` final length.

Inside :func:`~attnlab.hf.attach`, ``model.generate(..., output_attentions=True,
return_dict_in_generate=True)`` gives each forward pass's exact weights (the prompt's
``[B, H, T, T]``, then each new token's ``[B, H, 1, S]``). :func:`generate` runs it and one
more cached step, so that the last generated token's row is there too, and returns
attnlab's :class:`~attnlab.models.decoder.generation.GenerationOutput`: the generation
report, ``attention_maps()`` and the causal statistics take it as they take attnlab's own.

Without weights (``output_attentions=False``), greedy generation with a decoder whose layers
attnlab's native decoding step computes runs that step (:mod:`attnlab.hf.native_decoding`);
any other call runs transformers' ``generate`` as it is.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ..models.decoder.generation import GenerationOutput
from ..outputs import LayerAttentions
from .backend import attach
from .native_decoding import native_generate, unserved_reason

__all__ = ["generate"]


def generate(
    model: nn.Module,
    input_ids: Tensor,
    *,
    attention_mask: Optional[Tensor] = None,
    max_new_tokens: int = 32,
    output_attentions: bool = True,
    **generate_options: Any,
) -> GenerationOutput:
    """Generate with a transformers decoder and record every token's attention, or not.

    Args:
        model: a transformers ``*ForCausalLM`` whose attention goes through the registry.
        input_ids: ``[B, T]`` prompt ids (left-padded for a batch).
        attention_mask: ``[B, T]``, 1 on real tokens; default all real.
        max_new_tokens: tokens to generate (at least 1).
        output_attentions: record every step's weights; ``False``: greedy calls the native
            step serves (:func:`~attnlab.hf.native_decoding.unserved_reason`) run it, the
            others transformers' ``generate`` without recording.
        **generate_options: passed to ``model.generate`` (``do_sample``, ``temperature``, ...).

    Returns:
        :class:`~attnlab.models.decoder.generation.GenerationOutput` with ``attentions``
        (with ``output_attentions``): the prompt's pass, then one row per generated token.
    """
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError(f"{type(model).__name__} is an encoder-decoder model; attnlab.hf.generate takes "
                         f"decoder-only language models")
    if not callable(getattr(model, "generate", None)):
        raise TypeError(f"{type(model).__name__} cannot generate: give a transformers *ForCausalLM")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, T] tensor, got {getattr(input_ids, 'shape', input_ids)}")
    B, T = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    pad = generate_options.pop("pad_token_id", None)
    if pad is None:
        pad = getattr(model.generation_config, "pad_token_id", None) or getattr(model.generation_config,
                                                                              "eos_token_id", None)
        pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    if not output_attentions:
        if unserved_reason(model, B, **generate_options) is None:
            return native_generate(model, input_ids, mask, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                   **generate_options)
        with torch.no_grad():
            sequences = model.generate(input_ids=input_ids, attention_mask=mask,
                                       max_new_tokens=max_new_tokens, use_cache=True, pad_token_id=pad,
                                       **generate_options)
        full_mask = torch.cat([mask, torch.ones(B, sequences.shape[1] - T, dtype=mask.dtype)], dim=1)
        return GenerationOutput(sequences=sequences, attention_mask=full_mask.bool(), prompt_length=T)
    with torch.no_grad(), attach(model):
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, output_attentions=True,
            return_dict_in_generate=True, use_cache=True, pad_token_id=pad, **generate_options,
        )
        sequences = out.sequences  # [B, N]
        full_mask = torch.cat([mask, torch.ones(B, sequences.shape[1] - T, dtype=mask.dtype)], dim=1)
        passes = list(out.attentions)
        if sequences.shape[1] > T:  # the last generated token's own row: one more cached step
            cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
            positions = (full_mask.cumsum(-1) - 1).clamp_min(0)[:, -1:]  # as generate numbers left-padded rows
            # transformers names the cache argument `cache` from 5.24 on, `past_key_values` before
            keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            last = model(input_ids=sequences[:, -1:], attention_mask=full_mask, position_ids=positions,
                         use_cache=True, output_attentions=True, **{keyword: cache})
            passes.append(last.attentions)
        steps = [LayerAttentions([_at_key_positions(weights, T + index) for weights in step])
                 for index, step in enumerate(passes)]
    return GenerationOutput(sequences=sequences, attention_mask=full_mask.bool(), prompt_length=T,
                            attentions=tuple(steps))


def _at_key_positions(weights: Tensor, positions: int) -> Tensor:
    """``[B, H, Q, K]`` weights of a pass over ``positions`` keys -> ``[B, H, Q, positions]``.

    A sliding-window layer's cache (Gemma 2 and 3, Mistral's ``sliding_window``) keeps only
    its last ``K`` keys, so its weights arrive over those alone: they belong at the last
    ``K`` positions, with zeros (outside the window) before them.
    """
    K = weights.shape[-1]
    if K == positions:
        return weights
    if K > positions:
        raise RuntimeError(f"a generation step's weights cover {K} keys, more than the {positions} positions so far")
    return torch.nn.functional.pad(weights, (positions - K, 0))  # [B, H, Q, positions]
