"""SwiGLU feed-forward network (Shazeer 2020) in the Llama family's layout.

The same function as :class:`~attnlab.layers.ffn.GatedFFN` (one packed projection, the
layout ModernBERT stores), with the gate and the up projection kept as two matrices, as
Llama-family checkpoints store them.
"""

from __future__ import annotations

from typing import Callable, Union

from torch import Tensor, nn

from .._checks import check_positive_int
from .._precision import Linear
from .ffn import resolve_activation

__all__ = ["SwiGLUFFN"]


class SwiGLUFFN(nn.Module):
    """``down(activation(gate(x)) * up(x))``: SwiGLU with the default ``"silu"``.

    Pure, like :class:`~attnlab.layers.PositionWiseFFN`: the layer owns residuals and
    norms. Parameter names follow HuggingFace's Llama (``gate_proj``, ``up_proj``,
    ``down_proj``).

    Args:
        d_model: input and output width ``E``.
        d_ff: hidden width.
        activation: ``"silu"`` (SwiGLU), ``"gelu"``, ``"gelu_tanh"``, ``"relu"`` or a callable.
        bias: biases on the three projections.

    Shape:
        ``[..., E]`` -> ``[..., E]``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: Union[str, Callable[[Tensor], Tensor]] = "silu",
        bias: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("d_ff", d_ff)
        factory = {"device": device, "dtype": dtype}
        self.gate_proj = Linear(d_model, d_ff, bias=bias, **factory)
        self.up_proj = Linear(d_model, d_ff, bias=bias, **factory)
        self.down_proj = Linear(d_ff, d_model, bias=bias, **factory)
        self.activation = resolve_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
