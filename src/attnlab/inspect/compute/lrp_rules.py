"""Layer-wise relevance propagation rules, as Chefer, Gur & Wolf (CVPR 2021) apply them.

Dimension letters: ``B`` batch, ``I`` and ``O`` a linear map's input and output widths,
``N`` any further dimensions.

Each rule takes an operation's inputs and the relevance of its output (same shape as
the output) and returns the relevance of each input. They are the rules of the paper's
public code (``BERT_explainability/modules/layers_ours.py``), written as plain tensor
algebra instead of module hooks and autograd:

* :func:`linear_relevance` — LRP alpha-1-beta-0: only positive contributions
  (positive input x positive weight, negative input x negative weight) carry relevance;
  the bias is left out of the denominator, as theirs.
* :func:`matmul_relevance` — a product of two activations (``Q K^T``, ``A V``): each
  operand gets its gradient x input share of the output's relevance, halved, as their
  attention's relprop halves both shares.
* :func:`add_relevance` — a sum of two branches (a residual): gradient x input shares,
  each re-scaled so that the two branches split the incoming total in proportion to the
  absolute size of their shares.
* :func:`clone_relevance` — a tensor used several times: the uses' relevances add up.
* :func:`first_token_relevance`, :func:`mean_pool_relevance` — pooling, by their generic
  rule for an operation linear in its input (gradient x input over the output).

LayerNorm, the activations (GELU, tanh, ...), softmax and dropout pass relevance through
unchanged, as their ``RelProp`` base class does; they have no function here.

Every division goes through :func:`safe_divide`, their stabiliser.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "EPSILON",
    "add_relevance",
    "clone_relevance",
    "first_token_relevance",
    "linear_relevance",
    "matmul_relevance",
    "mean_pool_relevance",
    "safe_divide",
]

EPSILON = 1e-9  # their stabiliser: added to every denominator


def safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / (denominator + 1e-9)``, and 0 where ``denominator`` is exactly 0.

    Their ``safe_divide``; shapes broadcast.
    """
    shifted = denominator + EPSILON
    shifted = torch.where(shifted == 0, torch.full_like(shifted, EPSILON), shifted)
    quotient = numerator / shifted
    return torch.where(denominator != 0, quotient, torch.zeros_like(quotient))


def linear_relevance(x: Tensor, weight: Tensor, relevance: Tensor) -> Tensor:
    """LRP alpha-1-beta-0 through ``y = x W^T (+ b)``.

    ``R_x = x+ * (S W+) + x- * (S W-)`` with ``S = R / (x+ W+^T + x- W-^T)``, where
    ``+`` and ``-`` are the positive and negative parts. Each output's relevance is
    shared among the inputs in proportion to their positive contributions ``x_i w_ji > 0``,
    so the total is kept wherever an output has any positive contribution.

    Args:
        x: the layer's input.
        weight: ``[O, I]``.
        relevance: of the output.

    Shape:
        ``x`` ``[..., I]``, ``relevance`` ``[..., O]`` -> ``[..., I]``.
    """
    positive_x, negative_x = x.clamp(min=0), x.clamp(max=0)
    positive_w, negative_w = weight.clamp(min=0), weight.clamp(max=0)
    z = F.linear(positive_x, positive_w) + F.linear(negative_x, negative_w)  # [..., O]
    s = safe_divide(relevance, z)
    return positive_x * (s @ positive_w) + negative_x * (s @ negative_w)


def matmul_relevance(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """Relevance of both factors of ``a @ b``, half of each one's gradient x input share.

    With ``S = R / (a b)``: ``R_a = a * (S b^T) / 2`` and ``R_b = b * (a^T S) / 2``. Each
    unhalved share sums to the total of ``R`` (the product is linear in each factor), so
    the two halves together keep it.

    Shape:
        ``a`` ``[..., T, K]``, ``b`` ``[..., K, S]``, ``relevance`` ``[..., T, S]``
        -> ``([..., T, K], [..., K, S])``.
    """
    s = safe_divide(relevance, a @ b)  # [..., T, S]
    return a * (s @ b.transpose(-1, -2)) / 2, b * (a.transpose(-1, -2) @ s) / 2


def add_relevance(a: Tensor, b: Tensor, relevance: Tensor) -> tuple[Tensor, Tensor]:
    """Relevance of both terms of ``a + b`` (a residual connection), re-normalised.

    With ``S = R / (a + b)``, the gradient x input shares are ``a S`` and ``b S``; their
    totals ``s_a``, ``s_b`` (per example) set how the incoming total ``sum R`` is split:
    ``R_a = a S * (|s_a| / (|s_a| + |s_b|)) sum R / s_a`` and likewise ``R_b``. So
    ``sum R_a + sum R_b = sum R`` whenever both shares are non-zero. Their code sums over
    the whole batch; here each example (dim 0) is summed on its own, the same for one
    example.

    Shape:
        ``a``, ``b`` broadcastable to ``relevance`` ``[B, ...]`` -> two ``[B, ...]``.
    """
    s = safe_divide(relevance, a + b)
    share_a, share_b = a * s, b * s
    dims = tuple(range(1, relevance.dim()))  # everything but the example
    total_a, total_b = share_a.sum(dims, keepdim=True), share_b.sum(dims, keepdim=True)  # [B, 1, ...]
    total = relevance.sum(dims, keepdim=True)
    size = total_a.abs() + total_b.abs()
    factor_a = safe_divide(total_a.abs(), size) * total
    factor_b = safe_divide(total_b.abs(), size) * total
    return share_a * safe_divide(factor_a, total_a), share_b * safe_divide(factor_b, total_b)


def clone_relevance(x: Tensor, relevances: Sequence[Tensor]) -> Tensor:
    """Relevance of a tensor used several times: ``x * sum_i R_i / x`` (``sum_i R_i``
    wherever ``x`` is non-zero), their ``Clone`` rule.

    Shape:
        ``x`` and each relevance alike.
    """
    return x * sum(safe_divide(relevance, x) for relevance in relevances)


def first_token_relevance(hidden: Tensor, relevance: Tensor) -> Tensor:
    """Relevance of the hidden states behind first-token pooling ``hidden[:, 0]``.

    Shape:
        ``hidden`` ``[B, T, E]``, ``relevance`` ``[B, E]`` -> ``[B, T, E]``, zero past position 0.
    """
    result = torch.zeros_like(hidden)
    first = hidden[:, 0]  # [B, E]
    result[:, 0] = first * safe_divide(relevance, first)
    return result


def mean_pool_relevance(hidden: Tensor, mask: Optional[Tensor], relevance: Tensor) -> Tensor:
    """Relevance of the hidden states behind mean pooling over real tokens.

    Gradient x input over the output, their rule for averaging layers:
    ``R_t = hidden_t * w_t * R / pooled`` with ``w_t`` the token's weight in the mean.

    Shape:
        ``hidden`` ``[B, T, E]``, ``mask`` ``[B, T]`` (``True`` on real tokens, ``None``:
        every token), ``relevance`` ``[B, E]`` -> ``[B, T, E]``.
    """
    B, T, _ = hidden.shape
    real = torch.ones(B, T, dtype=hidden.dtype, device=hidden.device) if mask is None else mask.to(hidden.dtype)
    weights = real / real.sum(1, keepdim=True).clamp_min(1.0)  # [B, T]
    pooled = torch.einsum("bt,bte->be", weights, hidden)  # [B, E]
    s = safe_divide(relevance, pooled)  # [B, E]
    return hidden * weights[:, :, None] * s[:, None, :]
