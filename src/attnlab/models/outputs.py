"""What the task models return (see :mod:`attnlab.outputs` for the contract)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from ..outputs import LayerAttentions, ModelOutput

__all__ = ["ModelOutput", "TaskOutput"]


@dataclass(eq=False)
class TaskOutput(ModelOutput):
    """A task model's result, in HuggingFace's order: ``out[0]`` is the loss when labels
    were given, else the logits.

    Attributes:
        loss: mean loss over the batch when ``labels`` were given, else ``None``.
        logits: ``[B, C]`` class scores (classifier) or ``[B, T, V]`` token scores (masked LM).
        hidden_states: with ``output_hidden_states=True``, the embedding output and every
            layer's output ``[B, T, E]``; else ``None``.
        attentions: with ``output_attentions=True``, a
            :class:`~attnlab.outputs.LayerAttentions` (``attentions[0]`` and
            ``attentions["layer_1"]`` are layer 1); else ``None``.
        last_hidden_state: the encoder's ``[B, T, E]`` output.
    """

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    hidden_states: Optional[tuple[Tensor, ...]] = None
    attentions: Optional[LayerAttentions] = None
    last_hidden_state: Optional[Tensor] = None
