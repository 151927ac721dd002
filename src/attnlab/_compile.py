"""Compiling attnlab's C++ kernels on the user's machine, through torch's extension loader.

A library is compiled once per machine (and set of flags) into torch's extension cache
(``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``; the Makefile builds them
at install) and loaded; its operators register under ``torch.ops``. It needs a C++ compiler
and ninja.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

__all__ = ["compile_library"]


def compile_library(library: str, sources: Sequence[Path], headers: Sequence[Path],
                    flags: Sequence[str]) -> None:
    """Compile (or load from the cache) ``sources`` into ``library`` and load it.

    torch's cache key covers the sources and the flags, not the headers they include: the
    headers' digest goes into the flags, so that a changed header rebuilds.

    Args:
        library: the library's name, which is also its folder in the cache.
        sources: the C++ files, compiled and linked together.
        headers: every header they include.
        flags: the compiler's flags.

    Raises:
        RuntimeError: the build failed; the message names the sources and says why (no
            compiler, no ninja, a compile error).
    """
    from torch.utils.cpp_extension import load

    cflags = list(flags)
    if headers:
        digest = hashlib.sha256(b"".join(path.read_bytes() for path in headers))
        cflags.append(f"-DATTNLAB_HEADERS_DIGEST={digest.hexdigest()[:16]}")
    try:
        load(
            name=library,
            sources=[str(path) for path in sources],
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],  # at::parallel_for is OpenMP inlined into the library
            is_python_module=False,
            verbose=False,
        )
    except Exception as error:  # no compiler, no ninja, a compile error
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        names = ", ".join(path.name for path in sources)
        raise RuntimeError(f"could not build {names}: {first_line[:200]}") from error
