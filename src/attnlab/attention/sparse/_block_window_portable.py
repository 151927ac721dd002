"""attnlab's portable block-window kernel: float32, any CPU torch runs on, built on first use.

The kernel (``attnlab/_native/block_window.cpp``, on at::vec and torch's CPU GEMM: AVX2,
AVX-512 and ARM from one source) computes every block's attention over its window keys,
forward and backward; the global keys and the global tokens' rows stay in torch ops
(``_block_window_kernel``), as on torch's path. It is compiled by :func:`attnlab._native.build`
for the vector width torch dispatches to, once per machine. Before its first use in a
process its forward and backward are checked against float64 attention on a small input
with ragged sizes (a padding bias, windows past both ends, two heads): a kernel that
disagrees, or whose GEMM this build of torch lacks, is not used.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch import Tensor

from ... import _native

__all__ = ["build", "portable_kernel_status", "portable_unavailable_reason", "serves"]

_KERNEL = "block_window"


def serves(query: Tensor) -> bool:
    """Whether the kernel takes these inputs: float32 on the CPU."""
    return query.device.type == "cpu" and query.dtype == torch.float32


def build() -> Any:
    """The kernel's operators ``forward`` and ``backward`` (``torch.ops.attnlab_block_window``).

    ``forward(query [n, L, D], key_source, value_source, key_shift, value_shift, spread,
    heads, blocks, window_bias [B * N, W], biased [B * N], scale)`` returns the blocks'
    output over their windows ``[n, L, Dv]`` and its log-sum-exp ``[n, L]`` (``-inf``
    without a key); ``backward(..., grad_output [n, L, Dv], output, logsumexp, scale)``
    the gradients of the queries ``[n, L, D]`` and of the key and value blocks in sequence
    order ``[n, L, D]``, ``[n, L, Dv]``.
    """
    return _native.build(_KERNEL)


def portable_kernel_status() -> str:
    """``"ready (AVX2)"`` and the like, or why the kernel does not serve on this machine."""
    return portable_unavailable_reason() or _native.status(_KERNEL)


def portable_unavailable_reason() -> Optional[str]:
    """``None`` where the kernel is built and agrees with float64 attention, else why not."""
    reason = _native.unavailable_reason(_KERNEL)
    if reason is None and not _passes_check():
        return "it disagreed with float64 attention on this machine"
    return reason


@functools.cache
def _passes_check() -> bool:
    try:
        return _check()
    except RuntimeError:  # the kernel refused to run here (e.g. no CPU GEMM for it)
        return False


def _check() -> bool:
    """The kernel against float64 attention: two heads of 4 blocks of 12, window 1, padding."""
    generator = torch.Generator().manual_seed(0)
    H, N, L, D, Dv = 2, 4, 12, 10, 6
    query, key = (torch.randn(H * N, L, D, generator=generator) for _ in range(2))
    value, upstream = (torch.randn(H * N, L, Dv, generator=generator) for _ in range(2))
    key_bias = torch.zeros(N * L)
    key_bias[-L // 2 :] = float("-inf")  # padding
    own = key_bias.view(N, L)
    window_bias = torch.cat([own.roll(1, dims=0), own, own.roll(-1, dims=0)], dim=1)  # [N, W]
    window_bias[0, :L] = window_bias[-1, 2 * L :] = float("-inf")  # no neighbour there
    biased = window_bias.ne(0).any(1)
    scale = D**-0.5
    kernel = build()
    # keys and values read in place: window offset o of block i is block i - 1 + o
    output, logsumexp = kernel.forward(query, key, value, -1, -1, 3, H, N, window_bias, biased, scale)
    block = torch.arange(N * L) // L
    far = (block[:, None] - block[None, :]).abs() > 1  # [N L, N L]
    dense_bias = key_bias.expand(N * L, N * L).masked_fill(far, float("-inf")).double()
    q, k, v = (x.reshape(H, N * L, -1).double() for x in (query, key, value))
    grad = upstream.view(H, N * L, Dv).double()
    scores = q @ k.transpose(1, 2) * scale + dense_bias
    probs = torch.softmax(scores, dim=-1)  # every row has a key
    expected, expected_logsumexp = probs @ v, scores.logsumexp(dim=-1)
    scores_grad = probs * (grad @ v.transpose(1, 2) - (grad * expected).sum(-1, keepdim=True)) * scale
    exact = [scores_grad @ k, scores_grad.transpose(1, 2) @ q, probs.transpose(1, 2) @ grad]

    def close(mine: Tensor, exact: Tensor) -> bool:
        mine = mine.reshape(exact.shape).double()
        return bool(((mine - exact).abs().max() / exact.abs().max().clamp(min=1e-6)) <= 1e-4)

    if not (close(output, expected) and close(logsumexp, expected_logsumexp)):
        return False
    gradients = kernel.backward(query, key, value, -1, -1, 3, H, N, window_bias, biased, upstream, output,
                                logsumexp, scale)
    return all(close(mine, grad) for mine, grad in zip(gradients, exact))
