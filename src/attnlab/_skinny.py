"""Products of a few rows with a weight matrix at memory speed: the products of a decoding step.

A decoding step multiplies every weight matrix by one row per sequence; such a product
reads each weight once and is bounded by memory bandwidth. torch's float32 product
(MKL's gemv/gemm) reads the weights at 10-15 GB/s on a 2-core AMD EPYC whose cores read
40 GB/s. attnlab's native kernel (``_native/skinny_linear.cpp``, on at::vec: AVX2,
AVX-512 and ARM from one source) gets closer to the bandwidth; :func:`skinny_linear`
routes a product to it where it serves and returns ``None`` elsewhere, so the caller keeps
torch's product. The results agree with torch's to float32 rounding (another order of
additions, as between any two GEMM kernels).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _native
from ._dispatch import native_enabled, native_status, native_unavailable_reason, warn_once

__all__ = ["MAX_ROWS", "serves_rows", "skinny_linear", "skinny_kernel_status"]

MAX_ROWS = 8
"""Most rows the kernel takes; from there on torch's (or MKL's packed) GEMM is as fast."""

_KERNEL = "skinny_linear"


def skinny_kernel_status() -> str:
    """``"ready (AVX2)"`` and the like, or why the kernel does not serve on this machine."""
    return native_status(_KERNEL)


def serves_rows(rows: int) -> bool:
    """Whether the native kernel serves products of ``rows`` rows on this machine."""
    return 0 < rows <= MAX_ROWS and native_unavailable_reason(_KERNEL) is None


def skinny_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Optional[Tensor]:
    """``F.linear(x, weight, bias)`` by the native kernel, or ``None`` where it does not serve.

    It serves CPU inputs of at most :data:`MAX_ROWS` rows (all leading dims together),
    float32, bfloat16 or float16 (``x``, ``weight`` and ``bias`` of one dtype), outside
    autocast, autograd and compilation. bfloat16 and float16 weights are read as they are
    and the sums are float32, rounded to the dtype at the end, as a bfloat16 GEMM does.
    """
    if (x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or weight.dtype != x.dtype or x.device.type != "cpu"
            or x.numel() > MAX_ROWS * x.shape[-1] or x.numel() == 0):
        return None
    if (torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))):
        return None
    if bias is not None and bias.dtype != x.dtype:
        return None
    reason = native_unavailable_reason(_KERNEL)
    if reason is not None:
        if native_enabled():
            warn_once(f"attnlab's native products are not available ({reason}); "
                      "torch's serve, which is slower")
        return None
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()  # a few rows: a negligible copy
    bias = None if bias is None else bias.float().contiguous()
    out = _native.build(_KERNEL).linear(rows, weight.contiguous(), bias)
    return out.to(x.dtype).view(*x.shape[:-1], weight.shape[0])
