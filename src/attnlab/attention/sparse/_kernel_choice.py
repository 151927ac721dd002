"""Which kernel computes block-sparse attention's windows, and why.

Three paths compute the same numbers (each is tested against float64 attention):

* ``amx``: attnlab's AMX kernel (``_block_window_native``): bfloat16 and float32 on CPUs
  with AMX tiles, block size and head dims multiples of 32; windows, global keys and the
  global tokens' rows in one pass.
* ``portable``: attnlab's portable kernel (``_block_window_portable``): float32 on any
  CPU with a C++ compiler at hand (at::vec and torch's CPU GEMM: AVX2, AVX-512, ARM).
* ``torch``: torch's fused attention forward and a backward in torch ops; every dtype
  and device.

``ATTNLAB_SPARSE_KERNEL`` picks one, for tests and benchmarks: ``auto`` (the default:
``amx`` where the CPU has AMX, else ``portable`` where it builds, else ``torch``),
``amx``, ``portable`` or ``torch``. A path serves the inputs it takes and leaves the
others to ``torch`` (bfloat16 on the portable path, say). Asking for ``amx`` on a CPU
without AMX, or for ``portable`` where it cannot be built, is an error rather than a
silent fallback: a measurement must not report one path while timing another.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from torch import Tensor

from ... import _native
from ..._checks import env_choice
from . import _block_window_native as amx
from . import _block_window_portable as portable

__all__ = ["CHOICES", "VARIABLE", "KernelPath", "requested_kernel", "sparse_kernel_path", "window_kernel"]

VARIABLE = "ATTNLAB_SPARSE_KERNEL"
CHOICES = ("auto", "amx", "portable", "torch")


class KernelPath(NamedTuple):
    """A path (``"amx"``, ``"portable"`` or ``"torch"``) and why it serves."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def requested_kernel() -> str:
    """The path ``ATTNLAB_SPARSE_KERNEL`` asks for (``auto`` when unset).

    Raises:
        ValueError: the variable holds something else than one of :data:`CHOICES`.
    """
    return env_choice(VARIABLE, CHOICES, "auto")


def _amx_missing() -> Optional[str]:
    if not amx._has_amx():
        return "this CPU has no AMX tiles (or torch was built without oneDNN)"
    return amx._why_unavailable()


def _refuse(path: str, reason: str) -> RuntimeError:
    return RuntimeError(f"{VARIABLE}={path}, but that kernel is not available here: {reason}; "
                        f"choose one of {', '.join(CHOICES)}")


def sparse_kernel_path() -> KernelPath:
    """The path that serves float32 block-sparse attention on this CPU (block size and head
    dims multiples of 32, as the benchmarks use), and why; builds the kernels if needed.

    Raises:
        ValueError: ``ATTNLAB_SPARSE_KERNEL`` is not a valid choice.
        RuntimeError: it asks for a path this machine does not have.
    """
    requested = requested_kernel()
    if requested == "torch":
        return KernelPath("torch", f"{VARIABLE}=torch")
    if requested in ("auto", "amx"):
        missing = _amx_missing()
        if missing is None:
            return KernelPath("amx", "AMX tiles" + (f"; {VARIABLE}=amx" if requested == "amx" else ""))
        if requested == "amx":
            raise _refuse("amx", missing)
    reason = portable.portable_unavailable_reason()
    if reason is None:
        why = f"{VARIABLE}=portable" if requested == "portable" else "no AMX"
        return KernelPath("portable", f"{why}; at::vec {_native.capability()} build")
    if requested == "portable":
        raise _refuse("portable", reason)
    return KernelPath("torch", f"no AMX, portable kernel unavailable: {reason}")


def window_kernel(query: Tensor, value_dim: int, block_size: int, has_globals: bool,
                  scale: float) -> tuple[str, Any]:
    """The path that serves these inputs and its operators: ``("amx", ops)``,
    ``("portable", ops)`` or ``("torch", None)``.

    Raises:
        ValueError, RuntimeError: as :func:`sparse_kernel_path`.
    """
    requested = requested_kernel()
    if requested == "torch" or query.device.type != "cpu":
        return "torch", None
    if requested in ("auto", "amx"):
        missing = _amx_missing() if requested == "amx" else None
        if missing is not None:
            raise _refuse("amx", missing)
        ops = amx.native_window_kernel(query, value_dim, block_size, has_globals, scale)
        if ops is not None:
            return "amx", ops
        if requested == "amx":
            return "torch", None  # inputs the AMX kernel does not take
    if not portable.serves(query):
        return "torch", None
    reason = portable.portable_unavailable_reason()
    if reason is None:
        return "portable", portable.build()
    if requested == "portable":
        raise _refuse("portable", reason)
    if _native.enabled():
        _native.warn_once(f"attnlab's portable block-sparse kernel is not available ({reason}); "
                          "torch's path serves, which is slower")
    return "torch", None
