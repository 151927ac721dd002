"""attnlab's portable native kernels: one C++ source per kernel, compiled on the user's machine.

The kernels are written on ATen's portable vectors (``at::vec::Vectorized``, as torch's
own CPU kernels are) and torch's parallel loop, so one source gives AVX2, AVX-512 and
ARM (NEON) code: :func:`build` compiles it for the vector width torch itself dispatches
to on this CPU (``torch.backends.cpu.get_cpu_capability()``, which follows
``ATEN_CPU_CAPABILITY``), once per machine and width, into torch's extension cache
(:mod:`attnlab._compile`). Without a compiler or ninja a kernel is unavailable and its
caller keeps torch's path (same answer, slower). Whether a kernel serves a call, and the
switch that turns them all off (``ATTNLAB_NATIVE=0``), are :mod:`attnlab._dispatch`'s.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import torch

from .._compile import compile_library
from .._moved import moved_names

__all__ = ["build", "build_failure", "capability"]

_HERE = Path(__file__).parent
# The flags that make at::vec take a vector width: torch compiles its own kernels once per
# width with the same two macros.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


def capability() -> str:
    """The vector width the kernels are built for: torch's own dispatch choice on this CPU."""
    chosen = torch.backends.cpu.get_cpu_capability()
    return chosen if chosen in _CAPABILITY_FLAGS else "DEFAULT"


@functools.cache
def build(name: str) -> Any:
    """Compile (or load from the cache) ``_native/<name>.cpp``; its ``torch.ops`` namespace.

    Raises:
        RuntimeError: the build failed (the message says why: no compiler, no ninja, a
            compile error).
    """
    chosen = capability()
    compile_library(f"attnlab_{name}_{chosen.lower()}", [_HERE / f"{name}.cpp"], sorted(_HERE.glob("*.h")),
                    ["-O3", "-fopenmp", *_CAPABILITY_FLAGS.get(chosen, [])])
    return getattr(torch.ops, f"attnlab_{name}")


@functools.cache
def build_failure(name: str) -> Optional[str]:
    """``None`` where kernel ``name`` is built and loaded, else why not (builds it if needed)."""
    try:
        build(name)
    except RuntimeError as error:
        return str(error)
    return None


# enabled, status, unavailable_reason, warn_once: attnlab._dispatch's now (attnlab._moved)
__getattr__ = moved_names(__name__)
