"""Every block-sparse kernel path (portable, torch, AMX) against float64 attention, and the
switch that picks one (``ATTNLAB_SPARSE_KERNEL``).

Paths this machine cannot run are skipped: AMX without AMX tiles, the portable kernel
without a C++ compiler. The portable kernel is also checked as built for AVX2 (the vector
width of CPUs without AVX-512) in a subprocess, where this CPU has AVX-512.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import attnlab.attention.sparse._block_window_kernel as kernel
import attnlab.attention.sparse._block_window_native as amx
import attnlab.attention.sparse._block_window_portable as portable
from attnlab.attention.sparse._kernel_choice import CHOICES, VARIABLE, KernelPath, sparse_kernel_path
from attnlab.attention.sparse.block_sparse import block_sparse_attention


def _skip_reason(path: str) -> str | None:
    if path == "amx" and (not amx._has_amx() or amx._why_unavailable() is not None):
        return "the AMX kernel needs a CPU with AMX tiles and a C++ compiler"
    if path == "portable" and portable.portable_unavailable_reason() is not None:
        return f"the portable kernel is not available here ({portable.portable_unavailable_reason()})"
    return None


PATHS = [pytest.param(path, marks=pytest.mark.skipif(_skip_reason(path) is not None,
                                                     reason=str(_skip_reason(path))))
         for path in ("portable", "torch", "amx")]

CASES = [
    # (batch, heads, length, D, Dv, block, window, globals, real tokens per sequence)
    (1, 2, 512, 64, 64, 64, 1, (), None),  # whole blocks, no bias at all
    (1, 2, 512, 64, 64, 64, 1, (0, 256), (461,)),  # padding at the end, globals inside some windows
    (2, 2, 250, 32, 64, 32, 2, (3, 100, 249), (250, 190)),  # odd length, D != Dv
    (2, 2, 256, 64, 32, 32, 1, (50,), (256, 0)),  # a sequence with no key at all
    (3, 1, 128, 32, 32, 32, 3, (), (128, 64, 5)),  # windows wider than the sequence
    (1, 2, 1280, 32, 32, 32, 9, (600,), (1200,)),  # windows of 19 blocks
    (2, 3, 301, 24, 40, 20, 1, (), None),  # odd block size and head dims
    (1, 2, 97, 8, 8, 16, 0, (5,), (90,)),  # own block only, a ragged last block
    (2, 2, 1000, 16, 16, 128, 1, (999,), (1000, 777)),  # the benchmark's block size
]


def _aligned(case) -> bool:  # what the AMX kernel takes (the others go to torch's path there)
    _, _, _, D, Dv, block, *_ = case
    return D % 32 == 0 and Dv % 32 == 0 and block % 32 == 0


def _inputs(batch, heads, length, D, Dv, lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, heads, length, D, generator=generator) for _ in range(2))
    v, upstream = (torch.randn(batch, heads, length, Dv, generator=generator) for _ in range(2))
    valid = None
    if lengths is not None:
        valid = torch.arange(length)[None] < torch.tensor(lengths)[:, None]  # [B, T]
        valid[:, length // 3 : length // 3 + 5] = False  # keys removed in the middle too
    return q, k, v, upstream, valid


def _spy_on_paths(monkeypatch) -> list[str]:
    served: list[str] = []
    original = kernel.window_kernel

    def spy(*args):
        path, ops = original(*args)
        served.append(path)
        return path, ops

    monkeypatch.setattr(kernel, "window_kernel", spy)
    return served


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("batch, heads, length, D, Dv, block, window, globals_, lengths", CASES)
def test_every_path_matches_float64_forward_and_backward(
    golden, monkeypatch, path, batch, heads, length, D, Dv, block, window, globals_, lengths
) -> None:
    monkeypatch.setenv(VARIABLE, path)
    served = _spy_on_paths(monkeypatch)
    q, k, v, upstream, valid = _inputs(batch, heads, length, D, Dv, lengths)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = block_sparse_attention(*leaves, valid, block_size=block, window=window,
                                 global_positions=globals_).output
    (out * upstream).sum().backward()
    expected = "torch" if path == "amx" and not _aligned((batch, heads, length, D, Dv, block)) else path
    assert served == [expected]

    exact_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    exact = golden.block_sparse(*exact_leaves, valid, block, window, globals_)
    (exact * upstream.double()).sum().backward()
    for name, mine, reference in zip(("output", "dq", "dk", "dv"), (out, *(x.grad for x in leaves)),
                                     (exact, *(x.grad for x in exact_leaves))):
        assert torch.isfinite(mine).all(), name
        error = (mine.detach().double() - reference).abs().max() / reference.abs().max().clamp(min=1e-6)
        assert error < 1e-5, (name, float(error))


@pytest.mark.skipif(_skip_reason("portable") is not None, reason=str(_skip_reason("portable")))
def test_portable_kernel_reads_inputs_of_any_layout(golden, monkeypatch) -> None:
    # A contiguous input is read in place (windows start a window before its first block),
    # another is copied with zero blocks around it: keys and values at different offsets.
    monkeypatch.setenv(VARIABLE, "portable")
    q, k, v, upstream, valid = _inputs(2, 2, 384, 32, 32, (384, 200))
    k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = block_sparse_attention(*leaves, valid, block_size=32, window=2, global_positions=(9,)).output
    (out * upstream).sum().backward()
    exact_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    exact = golden.block_sparse(*exact_leaves, valid, 32, 2, (9,))
    (exact * upstream.double()).sum().backward()
    for mine, reference in zip((out, *(x.grad for x in leaves)), (exact, *(x.grad for x in exact_leaves))):
        assert (mine.detach().double() - reference).abs().max() / reference.abs().max() < 1e-5


@pytest.mark.skipif(_skip_reason("portable") is not None, reason=str(_skip_reason("portable")))
@pytest.mark.parametrize("threads", [1, 3])
def test_portable_kernel_with_any_number_of_threads(golden, monkeypatch, threads) -> None:
    # Backward tasks share key blocks with their neighbours; uneven splits cut heads and batches.
    monkeypatch.setenv(VARIABLE, "portable")
    monkeypatch.setenv("ATTNLAB_THREADS", "fixed")  # not cut to the free cores: the split is what is tested
    q, k, v, upstream, valid = _inputs(2, 3, 640, 32, 48, (640, 300))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = block_sparse_attention(*leaves, valid, block_size=32, window=1,
                                     global_positions=(0, 333)).output
        (out * upstream).sum().backward()
    finally:
        torch.set_num_threads(before)
    exact_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    exact = golden.block_sparse(*exact_leaves, valid, 32, 1, (0, 333))
    (exact * upstream.double()).sum().backward()
    for mine, reference in zip((out, *(x.grad for x in leaves)), (exact, *(x.grad for x in exact_leaves))):
        assert (mine.detach().double() - reference).abs().max() / reference.abs().max() < 1e-5


@pytest.mark.skipif(_skip_reason("portable") is not None, reason=str(_skip_reason("portable")))
def test_portable_kernel_serves_float32_only(monkeypatch) -> None:
    monkeypatch.setenv(VARIABLE, "portable")
    served = _spy_on_paths(monkeypatch)
    x = torch.randn(1, 2, 256, 32)
    for dtype in (torch.float64, torch.bfloat16, torch.float32):
        with torch.no_grad():
            block_sparse_attention(x.to(dtype), x.to(dtype), x.to(dtype), block_size=32, window=1)
    assert served == ["torch", "torch", "portable"]


def test_an_invalid_choice_is_one_line_naming_the_variable_and_the_choices(monkeypatch) -> None:
    monkeypatch.setenv(VARIABLE, "fastest")
    x = torch.randn(1, 1, 64, 8)
    for call in (sparse_kernel_path, lambda: block_sparse_attention(x, x, x, block_size=16)):
        with pytest.raises(ValueError) as raised:
            call()
        message = str(raised.value)
        assert "\n" not in message and VARIABLE in message and "'fastest'" in message
        assert all(choice in message for choice in CHOICES)


def test_amx_where_the_cpu_has_none_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(amx, "_has_amx", lambda: False)
    monkeypatch.setenv(VARIABLE, "amx")
    x = torch.randn(1, 1, 64, 32)
    for call in (sparse_kernel_path, lambda: block_sparse_attention(x, x, x, block_size=32)):
        with pytest.raises(RuntimeError, match=f"{VARIABLE}=amx, but .*no AMX tiles") as raised:
            call()
        assert "\n" not in str(raised.value)


def test_auto_without_amx_takes_the_portable_kernel_or_torchs_path(monkeypatch) -> None:
    monkeypatch.setattr(amx, "_has_amx", lambda: False)
    monkeypatch.delenv(VARIABLE, raising=False)
    chosen = sparse_kernel_path()
    assert isinstance(chosen, KernelPath) and str(chosen).startswith(chosen.name)
    assert chosen.name == ("portable" if portable.portable_unavailable_reason() is None else "torch")
    monkeypatch.setenv(VARIABLE, "torch")
    assert sparse_kernel_path().name == "torch"


def test_without_the_portable_kernel_auto_falls_back_and_says_why_once(golden, monkeypatch) -> None:
    monkeypatch.setattr(amx, "_has_amx", lambda: False)
    monkeypatch.setattr(portable, "portable_unavailable_reason", lambda: "no C++ compiler")
    monkeypatch.delenv(VARIABLE, raising=False)
    from attnlab import _native

    _native.warn_once.cache_clear()
    served = _spy_on_paths(monkeypatch)
    q, k, v, _, _ = _inputs(1, 2, 128, 16, 16, None)
    try:
        with pytest.warns(RuntimeWarning, match="portable block-sparse kernel is not available"):
            out = block_sparse_attention(q, k, v, block_size=32, window=1).output
    finally:
        _native.warn_once.cache_clear()
    assert served == ["torch"]
    exact = golden.block_sparse(q.double(), k.double(), v.double(), None, 32, 1, ())
    assert (out.double() - exact).abs().max() < 1e-5
    monkeypatch.setenv(VARIABLE, "portable")
    with pytest.raises(RuntimeError, match=f"{VARIABLE}=portable, but .*no C\\+\\+ compiler"):
        block_sparse_attention(q, k, v, block_size=32, window=1)


@pytest.mark.skipif(_skip_reason("portable") is not None, reason=str(_skip_reason("portable")))
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="only a CPU with AVX-512 has a second vector width to build for")
def test_the_avx2_build_matches_float64_too() -> None:
    """The same source built for AVX2 (what torch dispatches to under ATEN_CPU_CAPABILITY=avx2,
    as on a CPU without AVX-512), with globals, padding and odd sizes."""
    script = textwrap.dedent("""
        import sys
        import torch
        sys.path.insert(0, sys.argv[1])
        from conftest import golden_block_sparse_attention
        from attnlab.attention.sparse._kernel_choice import sparse_kernel_path
        from attnlab.attention.sparse.block_sparse import block_sparse_attention
        for B, H, T, D, Dv, L, w, globals_, lengths in [(2, 2, 250, 32, 64, 32, 2, (3, 100, 249), (250, 190)),
                                                        (2, 3, 301, 24, 40, 20, 1, (), None),
                                                        (1, 2, 1000, 16, 16, 128, 1, (999,), (777,))]:
            g = torch.Generator().manual_seed(0)
            q, k = (torch.randn(B, H, T, D, generator=g) for _ in range(2))
            v, up = (torch.randn(B, H, T, Dv, generator=g) for _ in range(2))
            valid = None if lengths is None else torch.arange(T)[None] < torch.tensor(lengths)[:, None]
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            out = block_sparse_attention(*leaves, valid, block_size=L, window=w,
                                         global_positions=globals_).output
            (out * up).sum().backward()
            exact_leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
            exact = golden_block_sparse_attention(*exact_leaves, valid, L, w, globals_)
            (exact * up.double()).sum().backward()
            for mine, ref in zip((out, *(x.grad for x in leaves)), (exact, *(x.grad for x in exact_leaves))):
                error = (mine.detach().double() - ref).abs().max() / ref.abs().max()
                assert error < 1e-5, (B, H, T, float(error))
        print(sparse_kernel_path())
    """)
    here = os.path.dirname(os.path.abspath(__file__))
    environment = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", VARIABLE: "portable"}
    done = subprocess.run([sys.executable, "-c", script, here], capture_output=True, text=True,
                          env=environment, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("at::vec AVX2 build)")


@pytest.mark.parametrize("path, threads_seen", [
    ("torch", [1, 1]),
    pytest.param("portable", [2, 2], marks=pytest.mark.skipif(_skip_reason("portable") is not None,
                                                                reason=str(_skip_reason("portable")))),
])
def test_on_a_busy_machine_torchs_path_runs_on_the_free_cores_and_a_kernel_on_every_thread(
        monkeypatch, path, threads_seen) -> None:
    # torch's path is many short parallel regions that wait for descheduled threads on a
    # busy machine: with one core free it runs on one thread. A native kernel is one long
    # parallel call: it keeps torch's threads. torch's setting comes back afterwards.
    from attnlab import _threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(_threads._WATCH, "free", lambda cores: 1.0)
    monkeypatch.delenv("ATTNLAB_THREADS", raising=False)
    monkeypatch.setenv(VARIABLE, path)
    seen: list[int] = []
    original = kernel.window_kernel

    def spy(*args):
        seen.append(torch.get_num_threads())
        return original(*args)

    monkeypatch.setattr(kernel, "window_kernel", spy)
    original_backward = kernel._BlockWindowAttention._backward
    monkeypatch.setattr(kernel._BlockWindowAttention, "_backward",
                        staticmethod(lambda ctx, grad: seen.append(torch.get_num_threads())
                                     or original_backward(ctx, grad)))
    try:
        q = torch.randn(1, 2, 128, 32, requires_grad=True)
        block_sparse_attention(q, q, q, block_size=32, window=1).output.sum().backward()
        assert seen == threads_seen and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("path", PATHS[:2])
@pytest.mark.parametrize("nan_keys, masked_keys, globals_", [
    ((64, 96), (96, 128), ()),  # some window keys NaN, the rest masked
    ((32, 128), None, (200,)),  # every window key NaN, a global key finite
])
def test_nan_keys_never_give_finite_garbage(monkeypatch, path, nan_keys, masked_keys, globals_) -> None:
    # The rows of query block 2 (keys 32-127 in its window) come out as no key (zero) or
    # NaN, never as finite numbers.
    monkeypatch.setenv(VARIABLE, path)
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 256, 32, generator=generator) for _ in range(3))
    k[..., nan_keys[0] : nan_keys[1], :] = float("nan")
    valid = None
    if masked_keys:
        valid = torch.ones(1, 256, dtype=torch.bool)
        valid[:, masked_keys[0] : masked_keys[1]] = False
    with torch.no_grad():
        out = block_sparse_attention(q, k, v, valid, block_size=32, window=1, global_positions=globals_)
    rows = out.output[0, 0, 64:96]
    assert ((rows == 0) | rows.isnan()).all()


def test_a_portable_kernel_that_fails_its_check_is_not_used(golden, monkeypatch) -> None:
    # A kernel that raises on this machine (say, torch's GEMM missing for it) or gives a
    # wrong answer is caught before use: auto falls back to torch's path and says why.
    from attnlab import _native

    def broken():
        raise RuntimeError("Float Brgemm is currently not supported")

    monkeypatch.setattr(amx, "_has_amx", lambda: False)
    monkeypatch.setattr(portable, "_check", broken)
    monkeypatch.delenv(VARIABLE, raising=False)
    portable._check_failure.cache_clear()
    _native.warn_once.cache_clear()
    try:
        assert portable.portable_unavailable_reason() == (
            "it failed on this machine: Float Brgemm is currently not supported")
        q, k, v, _, _ = _inputs(1, 2, 128, 16, 16, None)
        with pytest.warns(RuntimeWarning, match="Float Brgemm is currently not supported"):
            out = block_sparse_attention(q, k, v, block_size=32, window=1).output
        exact = golden.block_sparse(q.double(), k.double(), v.double(), None, 32, 1, ())
        assert (out.double() - exact).abs().max() < 1e-5
        monkeypatch.setattr(portable, "_check", lambda: False)
        portable._check_failure.cache_clear()
        assert portable.portable_unavailable_reason() == "it disagreed with float64 attention on this machine"
    finally:
        portable._check_failure.cache_clear()
        _native.warn_once.cache_clear()
