"""Real tokens of a padded batch, packed: position-wise work skips the padding.

Dimension letters: ``B`` batch, ``T`` padded length, ``N`` real tokens in the batch,
``C`` any feature size.

In a padded batch of reviews half the positions are often padding, and everything an
encoder layer does outside attention (projections, feed-forward net, LayerNorm,
dropout) treats positions one by one. :class:`TokenPacking` gathers the real tokens
into one ``[N, C]`` matrix for that work. Attention runs sequence by sequence on the
packed rows where that is cheaper (:meth:`TokenPacking.attend_by_sequence`), else, and
whenever it needs the padded layout (weights asked for, an extra mask), between a
scatter to ``[B, T, C]`` and a gather back. Padding positions come out as zeros.
``torch.nn.TransformerEncoder``'s nested-tensor fast path does the same in inference;
here it also works in training, where gradients flow through the gather and the
scatter.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["TokenPacking"]

# Attending sequence by sequence costs one kernel call and about ten autograd nodes per
# sequence, 0.1-0.2 ms on two CPU cores; the padded layout costs one call but spends
# E * (B * T^2 - sum of t^2) on padding. Measured break-even: about this much padding
# work (in units of E * t^2) per sequence. Short sequences in small models (8-token
# statements at width 64) stay in the padded layout; 60-token reviews at width 384 go
# sequence by sequence (30 % faster attention forward and backward).
PADDING_WORK_PER_CALL = 400_000


class TokenPacking:
    """Where the real tokens of a ``[B, T]`` batch sit, and the gather/scatter between layouts.

    Args:
        mask: ``[B, T]`` bool, ``True`` on real tokens.

    Example:
        >>> packing = TokenPacking(torch.tensor([[True, True, False], [True, False, False]]))
        >>> x = torch.arange(6.0).view(2, 3, 1)
        >>> packing.pack(x).flatten().tolist()
        [0.0, 1.0, 3.0]
        >>> packing.unpack(packing.pack(x)).flatten().tolist()
        [0.0, 1.0, 0.0, 3.0, 0.0, 0.0]
    """

    def __init__(self, mask: Tensor) -> None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.dim() != 2:
            got = f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(f"TokenPacking needs a [B, T] bool mask (True on real tokens), got {got}")
        self.mask = mask
        self.batch, self.length = mask.shape
        self.index = mask.reshape(-1).nonzero().squeeze(1)  # [N] flat positions in B * T
        counts = mask.sum(dim=1)  # [B]
        # Packed rows are batch-major: sequence b holds the next lengths[b] rows.
        self.lengths: list[int] = counts.tolist()  # real tokens per sequence
        self._squared_lengths = sum(count * count for count in self.lengths)
        positions = torch.arange(self.length, device=mask.device)
        # Right padding only: the real tokens of each sequence sit at positions 0..length-1.
        self.is_prefix = bool(torch.equal(mask, positions[None, :] < counts[:, None]))

    @classmethod
    def for_padding(cls, mask: Optional[Tensor]) -> Optional["TokenPacking"]:
        """A packing when ``mask`` (``[B, T]`` bool) holds any padding, else ``None``."""
        if mask is None or mask.dtype != torch.bool or mask.dim() != 2 or bool(mask.all()):
            return None
        return cls(mask)

    @property
    def num_tokens(self) -> int:
        return self.index.numel()

    def attend_by_sequence(self, width: int) -> bool:
        """Whether attention is cheaper sequence by sequence than in the padded layout.

        ``width`` is the model width ``E`` (heads times head dim); see
        ``PADDING_WORK_PER_CALL``.
        """
        padding_work = width * (self.batch * self.length**2 - self._squared_lengths)
        return padding_work >= PADDING_WORK_PER_CALL * self.batch

    def pack(self, x: Tensor) -> Tensor:
        """``[B, T, C]`` -> ``[N, C]``: the rows of the real tokens, in batch-major order."""
        if x.shape[:2] != (self.batch, self.length):
            raise ValueError(
                f"pack expects [B, T, C] with [B, T] = [{self.batch}, {self.length}], got {tuple(x.shape)}"
            )
        return x.reshape(self.batch * self.length, x.shape[-1]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """``[N, C]`` -> ``[B, T, C]`` with zeros at the padding positions."""
        if x.dim() != 2 or x.shape[0] != self.num_tokens:
            raise ValueError(f"unpack expects [N, C] with N = {self.num_tokens}, got {tuple(x.shape)}")
        full = x.new_zeros(self.batch * self.length, x.shape[1])
        full.index_copy_(0, self.index, x)  # in place into a fresh tensor: no clone of the zeros
        return full.view(self.batch, self.length, x.shape[1])

    def zero_padding_queries(self, weights: Tensor) -> Tensor:
        """Zero the rows of ``[B, H, T, S]`` attention weights that belong to padding queries.

        In place when no gradient flows through ``weights`` (a fresh ``[B, H, T, S]``
        tensor costs more than the pass), else out of place.
        """
        padding = ~self.mask[:, None, :, None]  # [B, 1, T, 1]
        if weights.requires_grad:
            return weights.masked_fill(padding, 0.0)
        return weights.masked_fill_(padding, 0.0)

    def __repr__(self) -> str:
        return f"TokenPacking(batch={self.batch}, length={self.length}, tokens={self.num_tokens})"
