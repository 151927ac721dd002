"""attnlab's AMX block-sparse attention kernel (forward and backward), built on first use.

The kernel (``_block_window_amx.cpp``, its backward in ``_block_window_amx_backward.cpp``,
their building blocks in ``_block_window_amx.h``) serves bfloat16 and float32 on CPUs with
AMX (torch's batch-reduce GEMM, which it is built on, takes bfloat16 operands in the AMX
layout) while oneDNN is enabled; it needs a C++ compiler and ninja, and is compiled once
per machine into torch's extension cache (:mod:`attnlab._compile`). Before its first use
on given dtype, block and head sizes its forward and backward are checked against float64
attention on a small input. Elsewhere the block-sparse kernel takes another path
(:mod:`attnlab._dispatch` chooses; slower, same answer): silently on CPUs without AMX,
where that is the normal path, and with one warning where the kernel should serve but
could not be built or failed its check.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor

from ..._compile import compile_library

__all__ = ["NO_AMX", "build", "status", "unserved_reason"]

_HERE = Path(__file__).parent
_SOURCES = [_HERE / "_block_window_amx.cpp", _HERE / "_block_window_amx_backward.cpp"]
_HEADERS = [_HERE / "_block_window_amx.h"]
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16"]
_ALIGN = 32  # block size and head dims must be multiples of this
NO_AMX = "this CPU has no AMX tiles (or torch was built without oneDNN)"


def _has_amx() -> bool:
    # The kernel is AVX-512 code: where torch is told to dispatch to less
    # (ATEN_CPU_CAPABILITY=avx2, as to stand in for an AVX2-only CPU), attnlab does too.
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return (bool(supported and supported()) and torch.backends.mkldnn.is_available()
            and torch.backends.cpu.get_cpu_capability() == "AVX512")


@functools.cache
def build() -> Any:
    """Compile (or load from the cache) the kernel; its operators ``forward`` and ``backward``.

    ``forward`` returns the blocks' output ``[n, L, Dv]`` and log-sum-exp ``[n, L]``, and
    the global tokens' rows ``[B * H, G, Dv]`` with their log-sum-exp ``[B * H, G]``.
    ``backward`` returns the gradients: of the queries ``[n, L, D]``, of the key and value
    blocks in sequence order ``[n, L, D]``, ``[n, L, Dv]`` (in the inputs' dtype), and of
    the global tokens' keys, values and queries ``[B * H, G, D | Dv | D]`` (float32 views),
    which the caller adds to (or, for the queries, puts into) the sequence's.

    Raises:
        RuntimeError: the CPU has no AMX, or the build failed (the message says why).
    """
    if not _has_amx():
        raise RuntimeError(NO_AMX)
    compile_library("attnlab_block_window_amx", _SOURCES, _HEADERS, _FLAGS)
    return torch.ops.attnlab_block_window_amx


def status() -> str:
    """``"ready"``, or why the kernel is not available on this machine (builds it if needed)."""
    return _why_unavailable() or "ready"


@functools.cache
def _why_unavailable() -> str | None:
    try:
        build()
    except RuntimeError as error:
        return str(error)
    return None


@functools.cache
def _passes_check(
    dtype: torch.dtype, block_size: int, head_dim: int, value_dim: int, with_globals: bool
) -> bool:
    """The kernel against float64 attention on one head of 4 blocks of these sizes."""
    try:
        return _check(dtype, block_size, head_dim, value_dim, with_globals)
    except RuntimeError:  # the kernel refused to run here
        return False


def _check(dtype: torch.dtype, block_size: int, head_dim: int, value_dim: int, with_globals: bool) -> bool:
    generator = torch.Generator().manual_seed(0)
    L, D, Dv, N, G = block_size, head_dim, value_dim, 4, 2 if with_globals else 0
    query, key = (torch.randn(N, L, D, generator=generator).to(dtype) for _ in range(2))
    value, upstream = (torch.randn(N, L, Dv, generator=generator).to(dtype) for _ in range(2))
    global_index = torch.tensor([1, N * L - 2])[:G]
    global_keys = key.view(1, N * L, D)[:, global_index]  # [1, G, D]
    global_values = value.view(1, N * L, Dv)[:, global_index]
    global_queries = query.view(1, N * L, D)[:, global_index]
    key_bias = torch.zeros(1, N * L)
    key_bias[0, -L // 2 :] = float("-inf")  # padding
    # The biases as block_sparse._block_bias makes them (not imported: block_sparse imports this).
    own = key_bias.view(N, L)
    # [N, W]: the keys of blocks i - 1, i, i + 1
    window_bias = torch.cat([own.roll(1, dims=0), own, own.roll(-1, dims=0)], dim=1)
    window_bias[0, :L] = window_bias[-1, 2 * L :] = float("-inf")  # no neighbour there
    biased = window_bias.ne(0).any(1)
    in_window = (global_index[None, :] // L - torch.arange(N)[:, None]).abs() <= 1  # [N, G]
    global_bias = key_bias[:, global_index].expand(N, G).masked_fill(in_window, float("-inf")).contiguous()
    scale = D**-0.5
    kernel = build()
    output, logsumexp, row_output, row_logsumexp = kernel.forward(
        query, key, value, -1, -1, 3, 1, N, window_bias, biased, global_keys,
        global_values, global_bias, global_queries, key_bias, scale,
    )
    # The same pattern as one dense [N * L, N * L] bias.
    block = torch.arange(N * L) // L
    far = (block[:, None] - block[None, :]).abs() > 1  # [N L, N L]
    dense_bias = key_bias.expand(N * L, N * L).masked_fill(far, float("-inf")).double()
    dense_bias[:, global_index] = key_bias[0, global_index].double()
    dense_bias[global_index] = key_bias.double()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4  # the probabilities are rounded to the dtype
    # The float64 reference's output and gradients, written out (no autograd: the check
    # also runs under torch.no_grad and inside autograd's own forward).
    q, k, v = (x.reshape(N * L, -1).double() for x in (query, key, value))
    grad = upstream.view(N * L, Dv).double()
    scores = q @ k.T * scale + dense_bias
    probs = torch.softmax(scores, dim=-1)  # every row has a key
    expected, expected_logsumexp = probs @ v, scores.logsumexp(dim=-1)
    scores_grad = probs * (grad @ v.T - (grad * expected).sum(dim=-1, keepdim=True)) * scale
    exact = [scores_grad @ k, scores_grad.T @ q, probs.T @ grad]

    def close(mine: Tensor, exact: Tensor) -> bool:
        return bool(((mine.double() - exact).abs().max() / exact.abs().max().clamp(min=1e-6)) <= tolerance)

    # The global tokens' rows replace their block rows, whose probabilities are then 0.
    output, logsumexp = output.view(N * L, Dv), logsumexp.view(N * L)
    output[global_index], logsumexp[global_index] = row_output[0], row_logsumexp[0]
    logsumexp_close = torch.allclose(logsumexp.double(), expected_logsumexp, atol=1e-3, rtol=1e-4)
    if not (close(output, expected) and logsumexp_close):
        return False
    logsumexp[global_index] = float("inf")
    global_grad = upstream.view(1, N * L, Dv)[:, global_index]
    grad_query, grad_key, grad_value, global_key_grad, global_value_grad, global_query_grad = kernel.backward(
        query, key, value, -1, -1, 3, 1, N, window_bias, biased, upstream, output.view(N, L, Dv),
        logsumexp.view(N, L), global_keys, global_values, global_bias, global_queries, global_grad,
        (global_grad.float() * output[global_index].float()).sum(-1), row_logsumexp, key_bias, scale,
    )
    grad_query, grad_key, grad_value = (
        x.reshape(N * L, -1).double() for x in (grad_query, grad_key, grad_value)
    )
    grad_key[global_index] += global_key_grad[0].double()
    grad_value[global_index] += global_value_grad[0].double()
    grad_query[global_index] = global_query_grad[0].double()
    return all(close(mine, grad) for mine, grad in zip((grad_query, grad_key, grad_value), exact))


def unserved_reason(query: Tensor, value_dim: int, block_size: int, has_globals: bool,
                    scale: float) -> Optional[str]:
    """``None`` where the kernel serves these inputs, else why not.

    It serves bfloat16 and float32 CPU tensors whose block size and head dims are
    multiples of 32, with a positive scale, on CPUs with AMX while oneDNN is enabled, where
    the kernel could be built and passed its check; where it should serve but could not be
    built or failed its check, it says so once.
    """
    if query.device.type != "cpu":
        return f"{query.device.type} tensors (it takes CPU ones)"
    if query.dtype not in (torch.bfloat16, torch.float32):
        return f"{query.dtype} (it takes bfloat16 and float32)"
    if scale <= 0:
        return f"scale {scale} (it takes a positive one)"
    if block_size % _ALIGN or query.shape[-1] % _ALIGN or value_dim % _ALIGN:
        return (f"block size {block_size}, head dims {query.shape[-1]}/{value_dim} "
                f"(it takes multiples of {_ALIGN})")
    if not _has_amx():  # torch's path is the normal one
        return NO_AMX
    if not torch.backends.mkldnn.enabled:
        return "oneDNN is turned off (torch.backends.mkldnn.enabled)"
    reason = _why_unavailable()
    if reason is not None:
        _warn_once(f"attnlab's block-sparse kernel is not available ({reason}); "
                   "using torch's fused attention, which is slower")
        return reason
    if not _passes_check(query.dtype, block_size, query.shape[-1], value_dim, has_globals):
        _warn_once(f"attnlab's block-sparse kernel disagreed with float64 attention ({query.dtype}, "
                   f"block size {block_size}, head dims {query.shape[-1]}/{value_dim}); "
                   "using torch's fused attention")
        return "it disagreed with float64 attention on this machine"
    return None


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
