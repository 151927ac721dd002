"""attnlab._dispatch: every switch value gives the path its docs name, with the reason, and
the paths passed over say why. The kernels are stood in for (built or not, AMX or not), so
that each answer is the same on every machine."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from attnlab import _dispatch, _native, _threads
from attnlab._dispatch import (
    NATIVE_OFF,
    SPARSE_KERNEL_VARIABLE,
    BlockWindowPath,
    KernelPath,
    block_window_path,
    sparse_kernel_path,
    window_kernel,
)
from attnlab.attention.sparse import _block_window_amx as amx
from attnlab.attention.sparse import _block_window_portable as portable

CAPABILITY = _native.capability()


@pytest.fixture(autouse=True)
def _fresh_answers():
    """The portable kernels' answers are kept per process (the switch is read once per
    kernel), and each warning is given once: both start afresh in every test."""
    _dispatch.native_unavailable_reason.cache_clear()
    _dispatch.warn_once.cache_clear()
    yield
    _dispatch.native_unavailable_reason.cache_clear()
    _dispatch.warn_once.cache_clear()


@pytest.fixture
def machine(monkeypatch):
    """``machine(amx=..., portable=...)``: a CPU with or without AMX (the AMX kernel then
    serves), and a portable kernel that builds (``None``) or fails with the reason given."""

    def stand_in(*, amx_tiles: bool, portable_failure: str | None) -> None:
        monkeypatch.setattr(amx, "_has_amx", lambda: amx_tiles)
        monkeypatch.setattr(amx, "_why_unavailable", lambda: None)
        monkeypatch.setattr(amx, "_passes_check", lambda *sizes: True)
        monkeypatch.setattr(amx, "build", lambda: "amx operators")
        monkeypatch.setattr(portable, "portable_unavailable_reason", lambda: portable_failure)
        monkeypatch.setattr(portable, "build", lambda: "portable operators")
        monkeypatch.delenv(SPARSE_KERNEL_VARIABLE, raising=False)
        monkeypatch.delenv("ATTNLAB_NATIVE", raising=False)

    return stand_in


def _query(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(1, 2, 64, 32, dtype=dtype)  # block size and head dims multiples of 32


def _path(dtype: torch.dtype = torch.float32) -> BlockWindowPath:
    return block_window_path(_query(dtype), 32, 32, True, 32**-0.5)


# ---- ATTNLAB_NATIVE ------------------------------------------------------------------


@pytest.mark.parametrize("value, enabled", [(None, True), ("1", True), ("on", True), ("yes", True),
                                            ("0", False), ("off", False), ("false", False)])
def test_the_native_switch_turns_the_portable_kernels_on_and_off(monkeypatch, value, enabled) -> None:
    if value is None:
        monkeypatch.delenv("ATTNLAB_NATIVE", raising=False)
    else:
        monkeypatch.setenv("ATTNLAB_NATIVE", value)
    built = []
    monkeypatch.setattr(_native, "build_failure", lambda name: built.append(name))  # built: None
    assert _dispatch.native_enabled() is enabled
    if enabled:
        assert _dispatch.native_unavailable_reason("skinny_linear") is None
        assert _dispatch.native_status("skinny_linear") == f"ready ({CAPABILITY})"
        assert built == ["skinny_linear"]
    else:
        assert NATIVE_OFF == "turned off by ATTNLAB_NATIVE=0"
        assert _dispatch.native_unavailable_reason("skinny_linear") == NATIVE_OFF
        assert _dispatch.native_status("skinny_linear") == NATIVE_OFF
        assert built == []  # nothing is built where the switch is off


def test_a_kernel_that_does_not_build_says_why(monkeypatch) -> None:
    monkeypatch.delenv("ATTNLAB_NATIVE", raising=False)
    monkeypatch.setattr(_native, "build_failure", lambda name: f"could not build {name}.cpp: no compiler")
    assert _dispatch.native_status("decode_step") == "could not build decode_step.cpp: no compiler"


def test_a_mistyped_native_switch_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("ATTNLAB_NATIVE", "maybe")
    with pytest.raises(ValueError, match="ATTNLAB_NATIVE='maybe' is not one of 1, on, true, yes, 0, off"):
        _dispatch.native_enabled()


# ---- ATTNLAB_SPARSE_KERNEL -----------------------------------------------------------


def test_auto_takes_the_amx_kernel_where_the_cpu_has_amx(machine) -> None:
    machine(amx_tiles=True, portable_failure=None)
    assert _path() == BlockWindowPath("amx", "AMX tiles", {}, "amx operators")
    assert sparse_kernel_path() == KernelPath("amx", "AMX tiles")


def test_auto_takes_the_portable_kernel_without_amx_and_says_why_not_amx(machine) -> None:
    machine(amx_tiles=False, portable_failure=None)
    path = _path()
    assert path == BlockWindowPath("portable", f"at::vec {CAPABILITY} build", {"amx": amx.NO_AMX},
                                   "portable operators")
    assert str(path) == f"portable (at::vec {CAPABILITY} build; not amx: {amx.NO_AMX})"
    assert window_kernel(_query(), 32, 32, True, 32**-0.5) == ("portable", "portable operators")
    assert sparse_kernel_path() == KernelPath("portable", f"no AMX; at::vec {CAPABILITY} build")


def test_auto_falls_back_to_torch_and_warns_once_where_the_portable_kernel_does_not_build(machine) -> None:
    machine(amx_tiles=False, portable_failure="no C++ compiler")
    unavailable = r"portable block-sparse kernel is not available \(no C\+\+ compiler\)"
    with pytest.warns(RuntimeWarning, match=unavailable):
        path = _path()
    assert path == BlockWindowPath("torch", "no kernel of attnlab's serves here",
                                   {"amx": amx.NO_AMX, "portable": "no C++ compiler"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        _path()
    assert sparse_kernel_path() == KernelPath("torch", "no AMX, portable kernel unavailable: no C++ compiler")


def test_with_the_native_switch_off_auto_takes_torch_without_a_warning(machine, monkeypatch) -> None:
    machine(amx_tiles=False, portable_failure=None)
    monkeypatch.setenv("ATTNLAB_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = _path()
    assert path.name == "torch" and path.passed_over["portable"] == NATIVE_OFF
    assert sparse_kernel_path() == KernelPath("torch", f"no AMX, portable kernel unavailable: {NATIVE_OFF}")


def test_inputs_a_kernel_does_not_take_go_to_torch_and_say_why(machine) -> None:
    machine(amx_tiles=False, portable_failure=None)
    path = _path(torch.bfloat16)
    assert path.name == "torch" and path.operators is None
    assert path.passed_over == {"amx": amx.NO_AMX, "portable": "torch.bfloat16 (it takes float32)"}
    machine(amx_tiles=True, portable_failure=None)
    unaligned = block_window_path(torch.zeros(1, 2, 60, 20), 20, 20, False, 0.2)
    assert unaligned.name == "portable"
    assert unaligned.passed_over == {"amx": "block size 20, head dims 20/20 (it takes multiples of 32)"}


def test_torch_is_taken_when_asked(machine, monkeypatch) -> None:
    machine(amx_tiles=True, portable_failure=None)
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "torch")
    assert _path() == BlockWindowPath("torch", "ATTNLAB_SPARSE_KERNEL=torch", {})
    assert sparse_kernel_path() == KernelPath("torch", "ATTNLAB_SPARSE_KERNEL=torch")


def test_amx_when_asked_serves_or_is_refused_never_replaced(machine, monkeypatch) -> None:
    machine(amx_tiles=True, portable_failure=None)
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "amx")
    assert _path() == BlockWindowPath("amx", "AMX tiles; ATTNLAB_SPARSE_KERNEL=amx", {}, "amx operators")
    assert sparse_kernel_path() == KernelPath("amx", "AMX tiles; ATTNLAB_SPARSE_KERNEL=amx")
    unaligned = block_window_path(torch.zeros(1, 2, 60, 20), 20, 20, False, 0.2)  # not the portable kernel
    assert (unaligned.name, unaligned.reason) == ("torch", "the AMX kernel does not take these inputs; "
                                                           "ATTNLAB_SPARSE_KERNEL=amx")
    machine(amx_tiles=False, portable_failure=None)
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "amx")
    for ask in (_path, sparse_kernel_path):
        with pytest.raises(RuntimeError, match="ATTNLAB_SPARSE_KERNEL=amx, but that kernel is not available "
                                               "here: this CPU has no AMX tiles"):
            ask()


def test_portable_when_asked_serves_or_is_refused(machine, monkeypatch) -> None:
    machine(amx_tiles=True, portable_failure=None)
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "portable")
    build = f"at::vec {CAPABILITY} build"
    assert _path() == BlockWindowPath("portable", f"{build}; ATTNLAB_SPARSE_KERNEL=portable", {},
                                      "portable operators")
    assert sparse_kernel_path() == KernelPath("portable", f"ATTNLAB_SPARSE_KERNEL=portable; {build}")
    machine(amx_tiles=True, portable_failure="no C++ compiler")
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "portable")
    for ask in (_path, sparse_kernel_path):
        with pytest.raises(RuntimeError, match=r"ATTNLAB_SPARSE_KERNEL=portable, but .*no C\+\+ compiler; "
                                               r"choose one of auto, amx, portable, torch"):
            ask()


def test_other_devices_take_torch(machine) -> None:
    machine(amx_tiles=True, portable_failure=None)
    path = block_window_path(torch.zeros(1, 2, 64, 32, device="meta"), 32, 32, True, 0.2)
    assert path == BlockWindowPath("torch", "meta tensors (attnlab's kernels are for the CPU)", {})


def test_a_mistyped_kernel_choice_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(SPARSE_KERNEL_VARIABLE, "fast")
    with pytest.raises(ValueError, match="ATTNLAB_SPARSE_KERNEL='fast' is not one of auto, amx, portable"):
        _path()


# ---- ATTNLAB_THREADS and the line for benchmarks --------------------------------------


@pytest.mark.parametrize("value, adaptive, words", [
    (None, True, "threads follow the free cores"),
    ("adaptive", True, "threads follow the free cores"),
    ("fixed", False, "threads fixed (ATTNLAB_THREADS=fixed)"),
])
def test_the_threads_switch_and_the_paths_line(machine, monkeypatch, value, adaptive, words) -> None:
    machine(amx_tiles=False, portable_failure=None)
    monkeypatch.setattr(_native, "build_failure", lambda name: None)
    if value is None:
        monkeypatch.delenv("ATTNLAB_THREADS", raising=False)
    else:
        monkeypatch.setenv("ATTNLAB_THREADS", value)
    assert _dispatch.threads_adaptive() is adaptive
    ready = f"ready ({CAPABILITY})"
    assert _dispatch.paths_line() == (
        f"attnlab paths: few-row products {ready}; decoding steps {ready}; causal softmax {ready}; "
        f"block-sparse portable (no AMX; at::vec {CAPABILITY} build); {words}")


# ---- the old homes of these names ----------------------------------------------------


def test_the_old_homes_of_the_switches_answer_with_the_same_objects() -> None:
    assert _native.enabled is _dispatch.native_enabled
    assert _native.status is _dispatch.native_status
    assert _native.unavailable_reason is _dispatch.native_unavailable_reason
    assert _native.warn_once is _dispatch.warn_once
    assert _threads.adaptive is _dispatch.threads_adaptive
    choice = importlib.import_module("attnlab.attention.sparse._kernel_choice")
    assert choice is _dispatch
    assert (choice.VARIABLE, choice.CHOICES) == (SPARSE_KERNEL_VARIABLE, _dispatch.SPARSE_KERNEL_CHOICES)
    assert choice.requested_kernel is _dispatch.requested_sparse_kernel
    assert importlib.import_module("attnlab._paths").paths_line is _dispatch.paths_line
    assert importlib.import_module("attnlab.attention.sparse._block_window_native") is amx
