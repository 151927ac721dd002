"""Which cache slot a decoding step writes, which slots it may attend, and its positions.

Shared by the decoding steps that bypass the modules' ``forward`` (compiled and native):
both write the new key and value into the next slot of a preallocated cache and attend to
every slot a mask allows (real tokens so far, within the sliding window).

Dimension letters: ``B`` batch, ``C`` cache slots.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["StepSlots"]


class StepSlots:
    """The slot, keep mask and positions of each decoding step after a prompt pass.

    Args:
        model: the :class:`~attnlab.models.decoder.DecoderForCausalLM` (its ``max_len``,
            sliding window and learned positions).
        batch: ``B``.
        capacity: ``C``, the slots of the cache's storage.
        length: positions the prompt pass cached.
        keep: ``[B, length]`` keep mask of the prompt (``None``: no padding).
        device: where the mask and positions live.
    """

    def __init__(self, model, batch: int, capacity: int, length: int, keep: Optional[Tensor], device) -> None:
        self.length = length
        self.allowed = torch.zeros(batch, capacity, dtype=torch.bool, device=device)  # [B, C]
        self.allowed[:, :length] = True if keep is None else keep
        self.positions = (torch.full((batch,), length, device=device) if keep is None
                          else keep.long().sum(-1))  # [B] position of the next token of each row
        self.window = model.config.sliding_window
        self.max_len = model.config.max_len
        self.learned_positions = model.embed_positions is not None

    def next_slot(self) -> int:
        """The slot the coming step writes; marks it (and no longer the keys out of the
        window's reach) in :attr:`allowed`."""
        slot = self.length
        if slot >= self.allowed.shape[1]:
            raise ValueError(f"the decoding cache holds {self.allowed.shape[1]} positions; all are used")
        if self.learned_positions and int(self.positions.max()) >= self.max_len:
            raise ValueError(f"position {int(self.positions.max())} is past max_len={self.max_len} "
                             "of this model")
        self.allowed[:, slot] = True
        if self.window is not None and slot - self.window >= 0:
            self.allowed[:, : slot - self.window + 1] = False  # keys `window` or more back are out of reach
        return slot

    def step_done(self) -> None:
        """The step wrote its slot: the next one continues after it."""
        self.length += 1
        self.positions = self.positions + 1
