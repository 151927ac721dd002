"""What the task models return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

__all__ = ["ModelOutput"]


@dataclass
class ModelOutput:
    """A task model's result.

    Attributes:
        logits: ``[B, C]`` class scores (classifier) or ``[B, T, V]`` token scores (masked LM).
        loss: mean loss over the batch when ``labels`` were given, else ``None``.
        attentions: ``{"layer_1": [B, H, T, T], ...}`` when ``output_attentions=True``.
        last_hidden_state: the encoder's ``[B, T, E]`` output.
    """

    logits: Tensor
    loss: Optional[Tensor] = None
    attentions: Optional[dict[str, Tensor]] = None
    last_hidden_state: Optional[Tensor] = None
