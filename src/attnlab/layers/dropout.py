"""``Dropout``: ``torch.nn.Dropout`` with a cheaper CPU path."""

from __future__ import annotations

from torch import Tensor, nn

from .._dropout import dropout

__all__ = ["Dropout"]


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` with the faster CPU path of :func:`attnlab._dropout.dropout`.

    A drop-in subclass: same arguments, same ``p`` attribute, no parameters or buffers.
    On CPU it draws 16 random bits per element, keeps a one-byte mask and applies it in
    two passes; forward and backward together run 2-3x faster than ``nn.Dropout``.
    ``p`` is rounded to a multiple of ``2**-16`` and the kept values are scaled by
    ``1 / (1 - rounded p)``, so the output stays unbiased. ``inplace=True`` and non-CPU
    tensors use ``nn.Dropout`` unchanged.

    Args:
        p: probability of zeroing an element (training only).
        inplace: operate in place (uses ``nn.Dropout``).

    Shape:
        any -> same shape.
    """

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
