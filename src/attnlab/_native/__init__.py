"""attnlab's portable native kernels: one C++ source per kernel, compiled on the user's machine.

The kernels are written on ATen's portable vectors (``at::vec::Vectorized``, as torch's
own CPU kernels are) and torch's parallel loop, so one source gives AVX2, AVX-512 and
ARM (NEON) code: :func:`build` compiles it for the vector width torch itself dispatches
to on this CPU (``torch.backends.cpu.get_cpu_capability()``, which follows
``ATEN_CPU_CAPABILITY``), once per machine and width, into torch's extension cache
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``; the Makefile builds
them at install). Without a compiler or ninja a kernel is unavailable and its caller
keeps torch's path (same answer, slower); ``ATTNLAB_NATIVE=0`` turns them all off.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from .._checks import env_choice

__all__ = ["build", "enabled", "status", "unavailable_reason"]

_HERE = Path(__file__).parent
# The flags that make at::vec take a vector width: torch compiles its own kernels once per
# width with the same two macros.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def enabled() -> bool:
    """Whether native kernels may serve (``ATTNLAB_NATIVE`` is not ``0``).

    Raises:
        ValueError: the variable holds something else than 1/on/true/yes or 0/off/false/no.
    """
    value = env_choice("ATTNLAB_NATIVE", _ON + _OFF, "1",
                       "set it to 0 to turn attnlab's native kernels off, or unset it")
    return value in _ON


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
    from torch.utils.cpp_extension import load

    chosen = capability()
    # torch's cache key covers the sources and the flags, not the headers they include: the
    # headers' digest goes into the flags, so that a changed header rebuilds.
    headers = hashlib.sha256(b"".join(path.read_bytes() for path in sorted(_HERE.glob("*.h"))))
    flags = ["-O3", "-fopenmp", *_CAPABILITY_FLAGS.get(chosen, []),
             f"-DATTNLAB_HEADERS_DIGEST={headers.hexdigest()[:16]}"]
    library = f"attnlab_{name}_{chosen.lower()}"
    try:
        load(
            name=library,
            sources=[str(_HERE / f"{name}.cpp")],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP inlined into the library
            is_python_module=False,
            verbose=False,
        )
    except Exception as error:  # no compiler, no ninja, a compile error
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RuntimeError(f"could not build {name}.cpp: {first_line[:200]}") from error
    return getattr(torch.ops, f"attnlab_{name}")


@functools.cache
def unavailable_reason(name: str) -> Optional[str]:
    """``None`` where kernel ``name`` is built and loaded, else why not (builds it if needed)."""
    if not enabled():
        return "turned off by ATTNLAB_NATIVE=0"
    try:
        build(name)
    except RuntimeError as error:
        return str(error)
    return None


def status(name: str) -> str:
    """``"ready (AVX2)"`` and the like, or why kernel ``name`` is not available."""
    return unavailable_reason(name) or f"ready ({capability()})"


@functools.cache
def warn_once(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)
