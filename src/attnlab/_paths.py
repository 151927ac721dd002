"""Which of attnlab's machine-dependent paths serve in this process, in one line for the
benchmarks to print beside their ratios (it sits above :mod:`attnlab._machine` and
:mod:`attnlab._threads`, which it reads)."""

from __future__ import annotations

from ._threads import adaptive

__all__ = ["paths_line"]


def paths_line() -> str:
    """Which of attnlab's machine-dependent paths serve in this process: the native kernels
    (few-row products, whole decoding steps, causal softmax), the block-sparse kernel path
    (float32) and whether threads follow the load (:mod:`attnlab._threads`)."""
    from . import _native  # the kernels build on first use: not at import
    from .attention.sparse._kernel_choice import sparse_kernel_path

    threads = "follow the free cores" if adaptive() else "fixed (ATTNLAB_THREADS=fixed)"
    return (f"attnlab paths: few-row products {_native.status('skinny_linear')}; "
            f"decoding steps {_native.status('decode_step')}; "
            f"causal softmax {_native.status('causal_softmax')}; "
            f"block-sparse {sparse_kernel_path()}; threads {threads}")
