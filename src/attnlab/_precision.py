"""bfloat16 matrix multiplication on CPUs that do not have it.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` every ``Linear`` runs in
bfloat16. On a CPU without native bfloat16 arithmetic (no AVX512-BF16 or AMX: an
AVX2-only CPU, say) torch falls back to an emulated kernel: a ``Linear``
4096x512->2048 takes 0.54 s forward instead of 0.08 s in float32, and 11 s backward
instead of 0.18 s.

A bfloat16 GEMM multiplies bfloat16 operands and accumulates in float32. Products of
two bfloat16 numbers (8-bit significands) are exact in float32 (24 bits), so the same
numbers come out of a float32 GEMM on the bfloat16-rounded operands, rounded to
bfloat16 at the end; only the order of the float32 additions may differ, as it does
between any two GEMM kernels. :func:`linear` does exactly that on such CPUs: operands
and saved activations stay bfloat16 (autocast's memory saving), the arithmetic runs
in torch's fast float32 GEMM. Everywhere else it is ``F.linear``.

Attention (:func:`attnlab.attention.functional.attention`) does the same for the same
reason: torch's bfloat16 flash-attention backward on such a CPU takes 1.2 s where the
float32 one takes a fraction of that (B=8, T=512, 8 heads), so bfloat16 queries, keys
and values are attended in float32 there (:func:`bf16_is_emulated`) and the result is
rounded back to bfloat16.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._packed_weights import packed_linear
from ._skinny import skinny_linear

__all__ = ["cpu_has_native_bf16", "bf16_is_emulated", "linear", "Linear"]


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (oneDNN's own check)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def bf16_is_emulated(x: Tensor) -> bool:
    """True for a bfloat16 CPU tensor on a CPU without native bfloat16 arithmetic."""
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and not cpu_has_native_bf16()


def emulates_bf16_autocast(x: Tensor, weight: Tensor) -> bool:
    """True inside CPU bfloat16 autocast, for CPU operands, where torch would emulate the GEMM."""
    return (
        x.device.type == "cpu"
        and torch.float64 not in (x.dtype, weight.dtype)  # autocast leaves float64 alone
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
        and not cpu_has_native_bf16()
    )


class _BF16LinearViaFP32(torch.autograd.Function):
    """``y = x w^T + b`` on bfloat16 operands, computed by float32 GEMMs; bfloat16 out.

    Saves the bfloat16 ``x`` and ``w`` for backward (the memory autocast would keep);
    gradients come back in bfloat16, as from autocast's own bfloat16 ``linear``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        with torch.autocast("cpu", enabled=False):
            out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(torch.bfloat16)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        with torch.autocast("cpu", enabled=False):
            grad32 = grad.float().reshape(-1, weight.shape[0])  # [M, out]
            if ctx.needs_input_grad[0]:
                grad_x = (grad32 @ weight.float()).to(torch.bfloat16).view(*grad.shape[:-1], weight.shape[1])
            if ctx.needs_input_grad[1]:
                grad_weight = (grad32.t() @ x.float().reshape(-1, weight.shape[1])).to(torch.bfloat16)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = grad32.sum(0).to(torch.bfloat16)
        return grad_x, grad_weight, grad_bias


def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``F.linear``, except for bfloat16 products on a CPU that would emulate them: under CPU
    bfloat16 autocast, or with a bfloat16 input and weight (a bfloat16 model's forward).

    There the operands are rounded to bfloat16 as autocast would, and the product is
    computed by float32 GEMMs (the same numbers a bfloat16 GEMM with float32
    accumulation gives, see the module notes) and returned in bfloat16.

    Shape:
        ``x`` ``[..., in]``, ``weight`` ``[out, in]``, ``bias`` ``[out]`` -> ``[..., out]``.
    """
    if bf16_is_emulated(x) and weight.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu"):
        # a bfloat16 model's forward (a prompt pass): the same products, in float32 GEMMs
        return _BF16LinearViaFP32.apply(x, weight, None if bias is None else bias.to(torch.bfloat16))
    if not emulates_bf16_autocast(x, weight):
        return F.linear(x, weight, bias)
    with torch.autocast("cpu", enabled=False):
        return _BF16LinearViaFP32.apply(
            x.to(torch.bfloat16),
            weight.to(torch.bfloat16),
            None if bias is None else bias.to(torch.bfloat16),
        )


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same ``state_dict``) that calls :func:`linear`; a
    product of a few rows (a decoding step's) goes to attnlab's native kernel
    (:mod:`attnlab._skinny`), and MKL's packed product serves inside
    :func:`attnlab._packed_weights.packed_for_rows`."""

    takes_packed_weights = True

    def forward(self, x: Tensor) -> Tensor:
        if "_packed_weight" in self.__dict__ and not torch.compiler.is_compiling():  # inductor cannot take it
            out = packed_linear(self, x)
            if out is not None:
                return out
        out = skinny_linear(x, self.weight, self.bias)
        if out is not None:
            return out
        return linear(x, self.weight, self.bias)
