"""What the decoder returns (see :mod:`attnlab.outputs` for the contract)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from ...layers.kv_cache import KVCache
from ...outputs import LayerAttentions, ModelOutput

__all__ = ["CausalLMOutput"]


@dataclass(eq=False)
class CausalLMOutput(ModelOutput):
    """A decoder forward pass, in HuggingFace's order (``out[0]`` is the loss when labels
    were given, else the logits).

    Attributes:
        loss: mean next-token cross-entropy when ``labels`` were given (``-100`` ignored).
        logits: ``[B, T, V]`` next-token scores of the new positions.
        past_key_values: the :class:`~attnlab.layers.kv_cache.KVCache` with the new
            positions appended, when ``use_cache=True``.
        hidden_states: with ``output_hidden_states=True``, the embedding output and every
            layer's output ``[B, T, E]`` (the last after the final norm).
        attentions: with ``output_attentions=True``, a
            :class:`~attnlab.outputs.LayerAttentions` of ``[B, H, T, S]`` weights: each new
            position over every position so far (cached ones included).
    """

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    past_key_values: Optional[KVCache] = None
    hidden_states: Optional[tuple[Tensor, ...]] = None
    attentions: Optional[LayerAttentions] = None
