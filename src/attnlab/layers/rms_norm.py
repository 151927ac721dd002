"""Root-mean-square layer normalisation (Zhang & Sennrich 2019), as Llama-family models use it."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._checks import check_positive_int

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dimension; no centring, no bias.

    The statistic is computed in float32 and the normalised value is cast back to the
    input's dtype before the weight is applied, as HuggingFace's Llama does, so the
    results match it bit for bit in every dtype.

    Args:
        d_model: width ``E`` of the last dimension.
        eps: added to the mean square.

    Shape:
        ``[..., E]`` -> ``[..., E]``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6, *, device=None, dtype=None) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
