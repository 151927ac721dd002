"""An independent float64 attention ("golden") and tolerance helpers for the kernel tests.

The golden implementation shares no code with ``attnlab``: it computes
``softmax(Q K^T / sqrt(D) + mask) V`` in float64 with an explicit, NaN-free treatment
of masked keys, and defines a row with no admissible key to have zero weights and zero
output (the library's convention).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from torch import Tensor


def golden_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    allowed: Optional[Tensor] = None,
    additive: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """float64 attention; ``allowed`` is bool (True = may attend), ``additive`` is added.

    Entries of ``additive`` equal to ``-inf`` count as not allowed. Returns
    ``(output [B, H, T, Dv], weights [B, H, T, S])``, differentiable without NaN.
    """
    q, k, v = query.double(), key.double(), value.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, T, S]
    keep = torch.ones_like(scores, dtype=torch.bool)
    if allowed is not None:
        keep = keep & allowed
    if additive is not None:
        additive = additive.double()
        finite = additive != float("-inf")
        keep = keep & finite
        scores = scores + torch.where(finite, additive, torch.zeros_like(additive))
    scores = torch.where(keep, scores, torch.zeros_like(scores))
    has_key = keep.any(dim=-1, keepdim=True)  # [B, H, T, 1]
    row_max = torch.where(keep, scores, torch.full_like(scores, -1e300)).amax(-1, keepdim=True)
    row_max = torch.where(has_key, row_max, torch.zeros_like(row_max)).detach()
    exp = torch.where(keep, torch.exp(scores - row_max), torch.zeros_like(scores))
    denominator = exp.sum(-1, keepdim=True)
    weights = exp / torch.where(has_key, denominator, torch.ones_like(denominator))
    return weights @ v, weights


def golden_block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    valid: Tensor | None,
    block_size: int,
    window: int,
    global_positions: tuple[int, ...],
) -> Tensor:
    """float64 block-sparse attention as dense attention over its ``[T, T]`` pattern.

    A query attends the keys of its block and of ``window`` blocks on each side, and
    every global token; a global token's query attends every key. ``valid`` ``[B, T]``
    (True = a real key) removes keys. Rows without a key give 0.
    """
    T = query.shape[2]
    block = torch.arange(T) // block_size
    allowed = (block[:, None] - block[None, :]).abs() <= window  # [T, T]
    inside = [position for position in global_positions if position < T]
    allowed[inside, :] = True
    allowed[:, inside] = True
    allowed = allowed[None, None]  # [1, 1, T, T]
    if valid is not None:
        allowed = allowed & valid[:, None, None, :]  # [B, 1, T, T]
    return golden_attention(query, key, value, allowed)[0]


def max_error(candidate: Tensor, golden: Tensor) -> float:
    if not golden.numel():
        return 0.0
    return float((candidate.detach().double() - golden.detach().double()).abs().max())


def golden_bound(reference_error: float, golden: Tensor, dtype: torch.dtype, fudge: float = 5.0) -> float:
    """How far from the golden result a low-precision path may land.

    PyTorch's rule for its fused kernels: a fast path may be at most ``fudge`` times
    less accurate than the plain (reference) computation in the same dtype, measured
    against a float64 golden run. ``eps * max(1, |golden|)`` is the floor, so a
    reference that happens to be exact does not demand exactness.
    """
    scale = max(1.0, float(golden.detach().abs().max())) if golden.numel() else 1.0
    return fudge * max(reference_error, torch.finfo(dtype).eps * scale)


def first_order_bound(dtype: torch.dtype, head_dim: int, key_len: int, scale: float) -> float:
    """Documented bound on the reference path's error vs golden.

    A first-order rounding bound: ``(D + S)`` accumulated roundings (one dot product
    of length ``D`` for each score, one of length ``S`` for each output), each at most
    ``eps`` relative to the magnitude ``scale`` of the operands, with a factor 4 slack
    for the softmax's exp and division.
    """
    return 4.0 * (head_dim + key_len) * torch.finfo(dtype).eps * max(1.0, scale)


@pytest.fixture(scope="session")
def golden() -> SimpleNamespace:
    """The golden attention and the tolerance helpers, for tests in this folder."""
    return SimpleNamespace(
        attention=golden_attention,
        block_sparse=golden_block_sparse_attention,
        max_error=max_error,
        bound=golden_bound,
        first_order_bound=first_order_bound,
    )
