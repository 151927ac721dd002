"""Where attnlab chooses its fast paths, and why: the one module that reads the switches.

Every fast path computes what a readable path beside it computes (each pair is tested
against float64 references), and serves only where it can:

* few-row products (:func:`attnlab._skinny.skinny_linear`): ``_native/skinny_linear.cpp``,
  beside ``F.linear``;
* decoding steps (``models/decoder/native_decoding.py``): ``_native/decode_step.cpp``,
  beside the modules' own forward;
* the HuggingFace backend's causal softmax (``hf/_kernel.py``): ``_native/causal_softmax.cpp``,
  beside torch's softmax;
* block-sparse attention's windows (``attention/sparse/_block_window_kernel.py``): ``amx``
  (``_block_window_amx``, CPUs with AMX tiles) and ``portable`` (``_block_window_portable``,
  on ``_native/block_window.cpp``), beside ``torch`` (``_block_window_torch``);
* the threads of heavy calls (:mod:`attnlab._threads`): the cores other processes leave
  free, beside torch's own setting.

The switches, for tests and benchmarks:

* ``ATTNLAB_NATIVE`` (``1``/``on``/``true``/``yes``, the default, or ``0``/``off``/``false``/
  ``no``): ``0`` turns attnlab's portable kernels (``_native/``) off, and torch's ops serve.
  It is read once per kernel and process. The AMX kernel answers to ``ATTNLAB_SPARSE_KERNEL``.
* ``ATTNLAB_SPARSE_KERNEL`` (``auto``, the default: ``amx`` where the CPU has AMX, else
  ``portable`` where it builds, else ``torch``; or ``amx``, ``portable``, ``torch``): a path
  serves the inputs it takes and leaves the others to ``torch`` (bfloat16 on the portable
  path, say). Asking for ``amx`` on a CPU without AMX, or for ``portable`` where it cannot
  be built, is an error rather than a silent fallback: a measurement must not report one
  path while timing another.
* ``ATTNLAB_THREADS`` (``adaptive``, the default, or ``fixed``): whether heavy calls run on
  the free cores or on torch's thread setting.

Not chosen here: fused or reference attention, which every attention call picks by
``need_weights`` (:func:`attnlab.attention.attention`), never by a switch.

Each answer says why: :class:`KernelPath` holds a path and the reason it serves, and
:func:`block_window_path` also lists why each faster path passed a call over (as xformers'
dispatch lists why an operator cannot serve an input). Where a faster path should serve but
could not be built, one warning says so.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, NamedTuple, Optional

from torch import Tensor

from . import _native
from ._checks import env_choice
from ._moved import moved_names

__all__ = [
    "NATIVE_OFF",
    "NATIVE_VARIABLE",
    "SPARSE_KERNEL_CHOICES",
    "SPARSE_KERNEL_VARIABLE",
    "THREADS_VARIABLE",
    "BlockWindowPath",
    "KernelPath",
    "block_window_path",
    "native_enabled",
    "native_status",
    "native_unavailable_reason",
    "paths_line",
    "requested_sparse_kernel",
    "sparse_kernel_path",
    "threads_adaptive",
    "warn_once",
    "window_kernel",
]

NATIVE_VARIABLE = "ATTNLAB_NATIVE"
SPARSE_KERNEL_VARIABLE = "ATTNLAB_SPARSE_KERNEL"
SPARSE_KERNEL_CHOICES = ("auto", "amx", "portable", "torch")
THREADS_VARIABLE = "ATTNLAB_THREADS"
NATIVE_OFF = f"turned off by {NATIVE_VARIABLE}=0"
"""Why a portable kernel does not serve where the switch turned them off."""

_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


class KernelPath(NamedTuple):
    """A path (``"amx"``, ``"portable"`` or ``"torch"``) and why it serves."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


class BlockWindowPath(NamedTuple):
    """The path that serves one block-sparse call, why, why each faster path passed it over
    (``{"amx": "this CPU has no AMX tiles ...", ...}``), and the path's operators
    (``forward`` and ``backward``; ``None`` on torch's path)."""

    name: str
    reason: str
    passed_over: dict[str, str]
    operators: Any = None

    def __str__(self) -> str:
        others = "".join(f"; not {name}: {why}" for name, why in self.passed_over.items())
        return f"{self.name} ({self.reason}{others})"


# ---- the switches -------------------------------------------------------------------


def native_enabled() -> bool:
    """Whether attnlab's portable kernels may serve (``ATTNLAB_NATIVE`` is not ``0``).

    Raises:
        ValueError: the variable holds something else than 1/on/true/yes or 0/off/false/no.
    """
    value = env_choice(NATIVE_VARIABLE, _ON + _OFF, "1",
                       "set it to 0 to turn attnlab's native kernels off, or unset it")
    return value in _ON


def requested_sparse_kernel() -> str:
    """The path ``ATTNLAB_SPARSE_KERNEL`` asks for (``auto`` when unset).

    Raises:
        ValueError: the variable holds something else than one of :data:`SPARSE_KERNEL_CHOICES`.
    """
    return env_choice(SPARSE_KERNEL_VARIABLE, SPARSE_KERNEL_CHOICES, "auto")


def threads_adaptive() -> bool:
    """Whether heavy calls run on the cores other processes leave free (``ATTNLAB_THREADS``
    is ``adaptive``, the default, not ``fixed``).

    Raises:
        ValueError: the variable holds something else.
    """
    value = env_choice(THREADS_VARIABLE, ("adaptive", "fixed"), "adaptive",
                       "set it to fixed to keep torch's thread count, or unset it")
    return value == "adaptive"


# ---- the portable kernels (_native/) ------------------------------------------------


@functools.cache
def native_unavailable_reason(name: str) -> Optional[str]:
    """``None`` where portable kernel ``name`` serves (the switch is on, and it is built and
    loaded), else why not; builds it if needed."""
    if not native_enabled():
        return NATIVE_OFF
    return _native.build_failure(name)


def native_status(name: str) -> str:
    """``"ready (AVX2)"`` and the like, or why portable kernel ``name`` does not serve."""
    return native_unavailable_reason(name) or f"ready ({_native.capability()})"


@functools.cache
def warn_once(message: str) -> None:
    """Warn, once per process and message, that a fast path which should serve does not."""
    warnings.warn(message, RuntimeWarning, stacklevel=3)


# ---- block-sparse attention's windows -----------------------------------------------


def _sparse_kernels():
    """The AMX and the portable block-window kernels' modules: imported when first asked
    for, not with this module, which the sparse package imports as it loads."""
    from .attention.sparse import _block_window_amx, _block_window_portable

    return _block_window_amx, _block_window_portable


def _amx_missing(amx) -> Optional[str]:
    """``None`` where the AMX kernel is built on this CPU, else why not."""
    if not amx._has_amx():
        return amx.NO_AMX
    return amx._why_unavailable()


def _portable_missing(portable) -> Optional[str]:
    """``None`` where the portable kernel may serve (the switch is on, and it is built and
    agrees with float64 attention), else why not."""
    return NATIVE_OFF if not native_enabled() else portable.portable_unavailable_reason()


def _refuse(path: str, reason: str) -> RuntimeError:
    return RuntimeError(f"{SPARSE_KERNEL_VARIABLE}={path}, but that kernel is not available here: {reason}; "
                        f"choose one of {', '.join(SPARSE_KERNEL_CHOICES)}")


def sparse_kernel_path() -> KernelPath:
    """The path that serves float32 block-sparse attention on this CPU (block size and head
    dims multiples of 32, as the benchmarks use), and why; builds the kernels if needed.

    Raises:
        ValueError: ``ATTNLAB_SPARSE_KERNEL`` is not a valid choice.
        RuntimeError: it asks for a path this machine does not have.
    """
    amx, portable = _sparse_kernels()
    requested = requested_sparse_kernel()
    if requested == "torch":
        return KernelPath("torch", f"{SPARSE_KERNEL_VARIABLE}=torch")
    if requested in ("auto", "amx"):
        missing = _amx_missing(amx)
        if missing is None:
            asked = f"; {SPARSE_KERNEL_VARIABLE}=amx" if requested == "amx" else ""
            return KernelPath("amx", "AMX tiles" + asked)
        if requested == "amx":
            raise _refuse("amx", missing)
    reason = _portable_missing(portable)
    if reason is None:
        why = f"{SPARSE_KERNEL_VARIABLE}=portable" if requested == "portable" else "no AMX"
        return KernelPath("portable", f"{why}; at::vec {_native.capability()} build")
    if requested == "portable":
        raise _refuse("portable", reason)
    return KernelPath("torch", f"no AMX, portable kernel unavailable: {reason}")


def block_window_path(query: Tensor, value_dim: int, block_size: int, has_globals: bool,
                      scale: float) -> BlockWindowPath:
    """The path that serves block-sparse windows of these inputs, why, why each faster path
    passed them over, and its operators; builds (and checks) the kernels if needed.

    Args:
        query: ``[B, H, T, D]``, whose device and dtype the kernels go by.
        value_dim: ``Dv``.
        block_size: ``L``.
        has_globals: whether there are global tokens.
        scale: the score scale.

    Raises:
        ValueError: ``ATTNLAB_SPARSE_KERNEL`` is not a valid choice.
        RuntimeError: it asks for a path this machine does not have.
    """
    requested = requested_sparse_kernel()
    if requested == "torch":
        return BlockWindowPath("torch", f"{SPARSE_KERNEL_VARIABLE}=torch", {})
    if query.device.type != "cpu":
        return BlockWindowPath("torch", f"{query.device.type} tensors (attnlab's kernels are for the CPU)", {})
    amx, portable = _sparse_kernels()
    passed_over: dict[str, str] = {}
    asked = f"; {SPARSE_KERNEL_VARIABLE}={requested}" if requested != "auto" else ""
    if requested in ("auto", "amx"):
        missing = _amx_missing(amx) if requested == "amx" else None
        if missing is not None:
            raise _refuse("amx", missing)
        why_not = amx.unserved_reason(query, value_dim, block_size, has_globals, scale)
        if why_not is None:
            return BlockWindowPath("amx", "AMX tiles" + asked, passed_over, amx.build())
        passed_over["amx"] = why_not
        if requested == "amx":
            return BlockWindowPath("torch", f"the AMX kernel does not take these inputs{asked}", passed_over)
    if not portable.serves(query):
        passed_over["portable"] = f"{query.dtype} (it takes float32)"
        return BlockWindowPath("torch", "no kernel of attnlab's takes these inputs", passed_over)
    reason = _portable_missing(portable)
    if reason is None:
        return BlockWindowPath("portable", f"at::vec {_native.capability()} build{asked}", passed_over,
                               portable.build())
    if requested == "portable":
        raise _refuse("portable", reason)
    if native_enabled():
        warn_once(f"attnlab's portable block-sparse kernel is not available ({reason}); "
                  "torch's path serves, which is slower")
    passed_over["portable"] = reason
    return BlockWindowPath("torch", "no kernel of attnlab's serves here", passed_over)


def window_kernel(query: Tensor, value_dim: int, block_size: int, has_globals: bool,
                  scale: float) -> tuple[str, Any]:
    """The path that serves these inputs and its operators: ``("amx", ops)``,
    ``("portable", ops)`` or ``("torch", None)`` (:func:`block_window_path`, without the reasons).

    Raises:
        ValueError, RuntimeError: as :func:`block_window_path`.
    """
    path = block_window_path(query, value_dim, block_size, has_globals, scale)
    return path.name, path.operators


# ---- all of them, in one line -------------------------------------------------------


def paths_line() -> str:
    """Which of attnlab's machine-dependent paths serve in this process, in one line for the
    benchmarks to print beside their ratios: the portable kernels (few-row products, whole
    decoding steps, causal softmax), the block-sparse kernel path (float32) and whether
    threads follow the load. Builds the kernels if needed."""
    threads = "follow the free cores" if threads_adaptive() else f"fixed ({THREADS_VARIABLE}=fixed)"
    return (f"attnlab paths: few-row products {native_status('skinny_linear')}; "
            f"decoding steps {native_status('decode_step')}; "
            f"causal softmax {native_status('causal_softmax')}; "
            f"block-sparse {sparse_kernel_path()}; threads {threads}")


# The names this module's parts had where they lived before (attention/sparse/_kernel_choice.py:
# VARIABLE, CHOICES, requested_kernel), in attnlab._moved's table.
__getattr__ = moved_names(__name__)
