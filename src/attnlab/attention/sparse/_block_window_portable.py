"""attnlab's portable block-window kernel: float32, any CPU torch runs on, built on first use.

The kernel (``attnlab/_native/block_window.cpp``, on at::vec and torch's CPU GEMM: AVX2,
AVX-512 and ARM from one source) computes every block's attention over its window keys and
the global keys, forward and backward; the global tokens' own rows (a few queries over
every key) stay in torch ops (``_block_window_torch``), as on torch's path. It is compiled
by :func:`attnlab._native.build` for the vector width torch dispatches to, once per machine.
Before its first use in a process its forward and backward are checked against float64
attention on a small input with ragged sizes (a padding bias, global keys, windows past
both ends, two heads): a kernel that disagrees, or whose GEMM this build of torch lacks,
is not used.
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
    heads, blocks, window_bias [B * N, W], biased [B * N], global_keys_t [B * H, D, G],
    global_values [B * H, G, Dv], global_bias [B * N, G], scale)`` returns the blocks'
    output over their window keys and the global keys ``[n, L, Dv]`` and its log-sum-exp
    ``[n, L]`` (``-inf`` without a key); ``backward(query, key_source, value_source,
    key_shift, value_shift, spread, heads, blocks, window_bias, biased, global_keys
    [B * H, G, D], global_keys_t, global_values, global_bias, grad_output [n, L, Dv],
    output, logsumexp, scale)`` the gradients of the queries ``[n, L, D]``, of the key and
    value blocks in sequence order ``[n, L, D]``, ``[n, L, Dv]``, of the global keys and
    values ``[B * H, G, D]``, ``[B * H, G, Dv]`` (to be added to the sequence's), and
    ``rowsum(dO * O)`` ``[n, L]``.
    """
    return _native.build(_KERNEL)


def portable_kernel_status() -> str:
    """``"ready (AVX2)"`` and the like, or why the kernel cannot run on this machine."""
    return portable_unavailable_reason() or f"ready ({_native.capability()})"


def portable_unavailable_reason() -> Optional[str]:
    """``None`` where the kernel is built and agrees with float64 attention, else why not
    (whether it may serve, ``ATTNLAB_NATIVE`` included, is :mod:`attnlab._dispatch`'s)."""
    return _native.build_failure(_KERNEL) or _check_failure()


@functools.cache
def _check_failure() -> Optional[str]:
    """``None`` where the kernel agrees with float64 attention here, else what went wrong."""
    try:
        agrees = _check()
    except RuntimeError as error:  # the kernel refused to run here (e.g. no CPU GEMM for it)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"it failed on this machine: {first_line[:200]}"
    return None if agrees else "it disagreed with float64 attention on this machine"


def _check() -> bool:
    """The kernel against float64 attention: two heads of 4 blocks of 12, window 1, padding,
    two global keys (one of them inside some windows, where the bias drops its copy)."""
    generator = torch.Generator().manual_seed(0)
    H, N, L, D, Dv = 2, 4, 12, 10, 6
    query, key = (torch.randn(H * N, L, D, generator=generator) for _ in range(2))
    value, upstream = (torch.randn(H * N, L, Dv, generator=generator) for _ in range(2))
    global_index = torch.tensor([1, N * L - 14])
    G = global_index.numel()
    global_keys = key.view(H, N * L, D)[:, global_index].contiguous()  # [H, G, D]
    global_values = value.view(H, N * L, Dv)[:, global_index].contiguous()
    key_bias = torch.zeros(N * L)
    key_bias[-L // 2 :] = float("-inf")  # padding
    own = key_bias.view(N, L)
    window_bias = torch.cat([own.roll(1, dims=0), own, own.roll(-1, dims=0)], dim=1)  # [N, W]
    window_bias[0, :L] = window_bias[-1, 2 * L :] = float("-inf")  # no neighbour there
    biased = window_bias.ne(0).any(1)
    in_window = (global_index[None, :] // L - torch.arange(N)[:, None]).abs() <= 1  # [N, G]
    global_bias = key_bias[global_index].expand(N, G).masked_fill(in_window, float("-inf")).contiguous()
    scale = D**-0.5
    kernel = build()
    global_keys_t = global_keys.transpose(1, 2).contiguous()  # [H, D, G]
    # keys and values read in place: window offset o of block i is block i - 1 + o
    output, logsumexp = kernel.forward(query, key, value, -1, -1, 3, H, N, window_bias, biased, global_keys_t,
                                       global_values, global_bias, scale)
    block = torch.arange(N * L) // L
    far = (block[:, None] - block[None, :]).abs() > 1  # [N L, N L]
    dense_bias = key_bias.expand(N * L, N * L).masked_fill(far, float("-inf")).double()
    dense_bias[:, global_index] = key_bias[global_index].double()
    q, k, v = (x.reshape(H, N * L, -1).double() for x in (query, key, value))
    grad = upstream.view(H, N * L, Dv).double()
    scores = q @ k.transpose(1, 2) * scale + dense_bias
    probs = torch.softmax(scores, dim=-1)  # every row has a key
    expected, expected_logsumexp = probs @ v, scores.logsumexp(dim=-1)
    row_term = (grad * expected).sum(-1)
    scores_grad = probs * (grad @ v.transpose(1, 2) - row_term[..., None]) * scale
    exact = [scores_grad @ k, scores_grad.transpose(1, 2) @ q, probs.transpose(1, 2) @ grad]

    def close(mine: Tensor, exact: Tensor) -> bool:
        mine = mine.reshape(exact.shape).double()
        return bool(((mine - exact).abs().max() / exact.abs().max().clamp(min=1e-6)) <= 1e-4)

    if not (close(output, expected) and close(logsumexp, expected_logsumexp)):
        return False
    grad_query, grad_key, grad_value, global_key_grad, global_value_grad, row_terms = kernel.backward(
        query, key, value, -1, -1, 3, H, N, window_bias, biased, global_keys, global_keys_t, global_values,
        global_bias, upstream, output, logsumexp, scale,
    )
    grad_key, grad_value = grad_key.view(H, N * L, D).clone(), grad_value.view(H, N * L, Dv).clone()
    grad_key[:, global_index] += global_key_grad
    grad_value[:, global_index] += global_value_grad
    return close(row_terms, row_term) and all(
        close(mine, grad) for mine, grad in zip((grad_query, grad_key, grad_value), exact)
    )
