"""The feed-forward nets of a Transformer block, every one pure (the layer owns residuals and norms).

* :class:`PositionWiseFFN`: ``Linear -> activation -> Dropout -> Linear -> Dropout`` (BERT, GPT-2);
* :class:`GatedFFN`: GLU family with one packed projection (ModernBERT's ``Wi``; GeGLU);
* :class:`SwiGLUFFN`: the same function with the gate and up projections apart, as Llama stores them.
"""

from __future__ import annotations

from typing import Callable, Union

import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_positive_int, check_probability
from .._precision import Linear
from .dropout import Dropout

__all__ = ["GatedFFN", "PositionWiseFFN", "SwiGLUFFN", "resolve_activation"]

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def resolve_activation(activation: Union[str, Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    """Map an activation name (``gelu``, ``gelu_tanh``, ``relu``, ``silu``) to a function."""
    if callable(activation):
        return activation
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)} or a callable, got {activation!r}")
    return _ACTIVATIONS[activation]


def _factory(d_model: int, d_ff: int, device, dtype) -> dict:
    """Check the widths; the ``device`` / ``dtype`` keywords of the projections."""
    check_positive_int("d_model", d_model)
    check_positive_int("d_ff", d_ff)
    return {"device": device, "dtype": dtype}


class PositionWiseFFN(nn.Module):
    """``Linear -> activation -> Dropout -> Linear -> Dropout``, applied at every position.

    Pure: no residual and no normalisation. The encoder layer owns those (the article's
    version added its own residual and LayerNorm, so the layer counted the residual
    twice).

    Args:
        d_model: input and output width ``E``.
        d_ff: hidden width.
        dropout: dropout after the activation and after the second projection.
        activation: ``"gelu"`` (exact, the default), ``"gelu_tanh"``, ``"relu"``,
            ``"silu"`` or a callable.

    Shape:
        ``[..., E]`` -> ``[..., E]``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.1,
        *,
        activation: Union[str, Callable[[Tensor], Tensor]] = "gelu",
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = _factory(d_model, d_ff, device, dtype)
        self.linear1 = Linear(d_model, d_ff, bias=bias, **factory)
        self.activation = resolve_activation(activation)
        self.dropout1 = Dropout(check_probability("dropout", dropout))
        self.linear2 = Linear(d_ff, d_model, bias=bias, **factory)
        self.dropout2 = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout1(self.activation(self.linear1(x)))))


class GatedFFN(nn.Module):
    """A gated feed-forward net (GLU family; GeGLU with GELU): ``W2(act(a) * g)`` where
    ``[a, g] = W1 x`` is one projection to ``2 * d_ff`` split in halves (ModernBERT's ``Wi``).

    Pure, like :class:`PositionWiseFFN`: the layer owns residuals and norms.

    Args:
        d_model: input and output width ``E``.
        d_ff: width of each half.
        dropout: dropout on the gated product.
        activation: applied to the first half (``"gelu"`` gives GeGLU, ``"silu"`` SwiGLU).
        bias: biases on both projections.

    Shape:
        ``[..., E]`` -> ``[..., E]``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.1,
        *,
        activation: Union[str, Callable[[Tensor], Tensor]] = "gelu",
        bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = _factory(d_model, d_ff, device, dtype)
        self.linear1 = Linear(d_model, 2 * d_ff, bias=bias, **factory)
        self.activation = resolve_activation(activation)
        self.dropout = Dropout(check_probability("dropout", dropout))
        self.linear2 = Linear(d_ff, d_model, bias=bias, **factory)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.linear1(x).chunk(2, dim=-1)  # each [..., d_ff]
        return self.linear2(self.dropout(self.activation(value) * gate))


class SwiGLUFFN(nn.Module):
    """``down(activation(gate(x)) * up(x))``: SwiGLU with the default ``"silu"``.

    The function of :class:`GatedFFN` (Shazeer 2020), with the gate and the up projection
    kept as two matrices, as Llama-family checkpoints store them.

    Pure, like :class:`PositionWiseFFN`: the layer owns residuals and
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
        factory = _factory(d_model, d_ff, device, dtype)
        self.gate_proj = Linear(d_model, d_ff, bias=bias, **factory)
        self.up_proj = Linear(d_model, d_ff, bias=bias, **factory)
        self.down_proj = Linear(d_ff, d_model, bias=bias, **factory)
        self.activation = resolve_activation(activation)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
