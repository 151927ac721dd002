"""attnlab's block-sparse kernel (AMX CPUs, bfloat16 and float32) against float64 and torch's path.

The kernel is built on first use; where the CPU has no AMX or nothing can compile it,
the tests that need it are skipped and the fallback tests still run.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from types import SimpleNamespace

import pytest
import torch

import attnlab.attention.sparse._block_window_kernel as kernel
import attnlab.attention.sparse._block_window_native as native
from attnlab.attention.sparse.block_sparse import block_sparse_attention


def _native_available() -> bool:
    return native._why_unavailable() is None


needs_native = pytest.mark.skipif(
    not _native_available(), reason="attnlab's block-sparse kernel needs an AMX CPU and a C++ compiler"
)


CASES = [
    # (batch, heads, length, D, Dv, block, window, globals, real tokens per sequence)
    (1, 2, 512, 64, 64, 64, 1, (0, 256), (461,)),  # padding at the end, globals inside some windows
    (2, 2, 250, 32, 64, 32, 2, (3, 100, 249), (250, 190)),  # not whole blocks, D != Dv
    (2, 2, 256, 64, 32, 32, 1, (50,), (256, 0)),  # a sequence with no key at all
    (1, 3, 384, 32, 32, 32, 0, (7, 8, 299), None),  # globals only, no padding
    (3, 1, 128, 32, 32, 32, 3, (), (128, 64, 5)),  # windows wider than the sequence
    (1, 2, 1024, 64, 64, 128, 1, (), None),  # the benchmark's shape, smaller: no bias at all
    (2, 2, 2304, 32, 32, 32, 1, (5, 2000), (2304, 1500)),  # several chunks per thread, heads inside chunks
    (1, 2, 1280, 32, 32, 32, 9, (600,), (1200,)),  # windows of 19 blocks: backward chunks of 36 (2 * 2w)
]
DTYPES = [torch.bfloat16, torch.float32]
GRADIENT_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}  # of the largest value


def _inputs(batch, heads, length, D, Dv, lengths, seed=0, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, heads, length, D, generator=generator).to(dtype) for _ in range(2))
    v = torch.randn(batch, heads, length, Dv, generator=generator).to(dtype)
    upstream = torch.randn(batch, heads, length, Dv, generator=generator).to(dtype)
    valid = None
    if lengths is not None:
        valid = torch.arange(length)[None] < torch.tensor(lengths)[:, None]  # [B, T]
        valid[:, length // 3 : length // 3 + 5] = False  # keys removed in the middle too
    return q, k, v, upstream, valid


def _with_grads(output, leaves) -> list[torch.Tensor]:
    return [output.detach(), *(leaf.grad for leaf in leaves)]


def _attnlab_with_grads(q, k, v, upstream, valid, block, window, globals_) -> list[torch.Tensor]:
    """attnlab's output and the gradients of ``(output * upstream).sum()``: ``[out, dq, dk, dv]``."""
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = block_sparse_attention(*leaves, valid, block_size=block, window=window, global_positions=globals_)
    (out.output * upstream).sum().backward()
    return _with_grads(out.output, leaves)


def _golden_with_grads(golden, q, k, v, upstream, valid, block, window, globals_) -> list[torch.Tensor]:
    """The same from the float64 golden."""
    leaves = [x.double().requires_grad_(True) for x in (q, k, v)]
    out = golden.block_sparse(*leaves, valid, block, window, globals_)
    (out * upstream.double()).sum().backward()
    return _with_grads(out, leaves)


def _assert_relative_errors_below(mine, exact, tolerance) -> None:
    """Each tensor of ``mine`` within ``tolerance`` of the largest value of its ``exact`` twin."""
    for index, (mine_one, exact_one) in enumerate(zip(mine, exact, strict=True)):
        error = (mine_one.double() - exact_one).abs().max() / exact_one.abs().max()
        assert error < tolerance, (index, error)


@contextlib.contextmanager
def _threads(count: int):
    """torch's thread count set to ``count`` inside (kept, not cut to the free cores: the
    splits of the work are what is tested), restored after."""
    before, policy = torch.get_num_threads(), os.environ.get("ATTNLAB_THREADS")
    torch.set_num_threads(count)
    os.environ["ATTNLAB_THREADS"] = "fixed"
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if policy is None:
            del os.environ["ATTNLAB_THREADS"]
        else:
            os.environ["ATTNLAB_THREADS"] = policy


def _count_native_calls(monkeypatch) -> list[bool]:
    calls: list[bool] = []  # one per forward (the backward takes the forward's path)
    original = kernel.window_kernel

    def spy(*args):
        path, op = original(*args)
        calls.append(path == "amx")
        return path, op

    monkeypatch.setattr(kernel, "window_kernel", spy)
    return calls


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads, length, D, Dv, block, window, globals_, lengths", CASES)
def test_native_kernel_forward_and_backward_match_float64(
    golden, monkeypatch, dtype, batch, heads, length, D, Dv, block, window, globals_, lengths
) -> None:
    # Against float64 on the same rounded inputs. bfloat16: the output within 1 % of the
    # largest value (measured: under 0.5 %), and the gradients no further from float64
    # than those of torch's path (fused forward, or where that cannot serve the GEMM path,
    # and the backward in torch ops). float32: everything within 1e-4 of the largest value.
    calls = _count_native_calls(monkeypatch)
    q, k, v, upstream, valid = _inputs(batch, heads, length, D, Dv, lengths, dtype=dtype)
    case = (q, k, v, upstream, valid, block, window, globals_)
    results = []
    for use_native in (True, False):
        if not use_native:
            monkeypatch.setenv("ATTNLAB_SPARSE_KERNEL", "torch")
        results.append([x.double() for x in _attnlab_with_grads(*case)])
    assert calls == [True, False]  # the kernel, then torch's path (each backward takes its forward's)
    reference = _golden_with_grads(golden, *case)
    assert ((results[0][0] - reference[0]).abs().max() / reference[0].abs().max()) < 1e-2
    for name, mine, torchs, exact in zip(("output", "dq", "dk", "dv"), *results, reference):
        assert torch.isfinite(mine).all(), name
        scale = exact.abs().max().clamp(min=1e-3)
        mine_error, torchs_error = (mine - exact).abs().max() / scale, (torchs - exact).abs().max() / scale
        if dtype == torch.float32:
            assert mine_error < 1e-4, (name, mine_error, torchs_error)
        else:
            assert mine_error <= max(1.25 * torchs_error, 5e-3), (name, mine_error, torchs_error)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads, length, D, Dv, block, window, globals_, lengths",
                         [case for case in CASES if case[3] == case[4]])
def test_native_kernel_agrees_with_torch_fused_path(
    golden, monkeypatch, dtype, batch, heads, length, D, Dv, block, window, globals_, lengths
) -> None:
    q, k, v, _, valid = _inputs(batch, heads, length, D, Dv, lengths, seed=1, dtype=dtype)
    kwargs = {"block_size": block, "window": window, "global_positions": globals_}
    with torch.no_grad():
        mine = block_sparse_attention(q, k, v, valid, **kwargs).output
        monkeypatch.setenv("ATTNLAB_SPARSE_KERNEL", "torch")
        torchs = block_sparse_attention(q, k, v, valid, **kwargs).output
    reference = golden.block_sparse(q, k, v, valid, block, window, globals_)
    scale = reference.abs().max()
    assert (mine.double() - torchs.double()).abs().max() / scale < (2e-2 if dtype == torch.bfloat16 else 1e-5)
    # and the kernel is about as close to float64 as torch's path (bfloat16: one rounding less)
    assert (mine.double() - reference).abs().max() <= 1.5 * (torchs.double() - reference).abs().max() + 1e-6


@needs_native
def test_native_kernel_serves_only_what_it_supports(monkeypatch) -> None:
    calls = _count_native_calls(monkeypatch)
    x = torch.randn(1, 2, 256, 32)
    for dtype, D, block in ((torch.float64, 32, 64), (torch.bfloat16, 16, 64), (torch.float32, 32, 48),
                            (torch.bfloat16, 32, 64), (torch.float32, 32, 64)):
        q = x[..., :D].to(dtype)
        with torch.no_grad():
            block_sparse_attention(q, q, q, block_size=block, window=1)
    assert calls == [False, False, False, True, True]  # float64, head dim 16, block 48: torch's path


@needs_native
@pytest.mark.parametrize("contiguous_key", [True, False])
def test_keys_and_values_of_different_layouts(golden, monkeypatch, contiguous_key) -> None:
    # Regression: a contiguous input is read in place (its windows start one window
    # before its first block), another one is copied with zero blocks around it; values
    # were read with the keys' offset (wrong output, or reads past the value buffer).
    calls = _count_native_calls(monkeypatch)
    q, k, v, upstream, _ = _inputs(1, 2, 256, 32, 32, None, dtype=torch.float32)
    if contiguous_key:
        v = v.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, another layout
    else:
        k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    case = (q, k, v, upstream, None, 32, 2, (9,))
    mine = _attnlab_with_grads(*case)
    assert calls == [True]
    _assert_relative_errors_below(mine, _golden_with_grads(golden, *case), 1e-4)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, heads, length, D, Dv, window, globals_, lengths, threads", [
    (1, 2, 512, 32, 64, 1, tuple(range(3, 3 + 7 * 17, 7)), (500,), 2),  # 17 global tokens: padded to 32
    (1, 2, 640, 64, 96, 1, tuple(range(1, 1 + 15 * 37, 15)), (600,), 2),  # 37 global tokens: padded to 48
    (1, 5, 96, 32, 32, 1, (0, 50), None, 8),  # more threads than chunks of 16: chunks of 4 blocks
    (2, 3, 160, 64, 32, 3, (10, 150), (160, 90), 7),  # chunks of 12 blocks (2 * 2 w), heads across threads
    (3, 2, 200, 32, 32, 2, (), (200, 10, 0), 5),  # a short and an empty sequence
    (1, 2, 224, 32, 32, 3, (40, 200), None, 4),  # chunks of 12 blocks, the last of 2
    (1, 1, 64, 32, 32, 3, (10,), None, 2),  # fewer blocks than 2 w
])
def test_many_global_tokens_and_small_chunks(
    golden, monkeypatch, dtype, batch, heads, length, D, Dv, window, globals_, lengths, threads
) -> None:
    # The backward's chunks shrink to keep every thread busy, down to twice the 2 w blocks
    # they share with each neighbour; the global tokens come in multiples of 16.
    calls = _count_native_calls(monkeypatch)
    q, k, v, upstream, valid = _inputs(batch, heads, length, D, Dv, lengths, dtype=dtype)
    case = (q, k, v, upstream, valid, 32, window, globals_)
    with _threads(threads):
        mine = _attnlab_with_grads(*case)
    assert calls == [True]
    _assert_relative_errors_below(mine, _golden_with_grads(golden, *case), GRADIENT_TOLERANCE[dtype])


@needs_native
def test_a_forward_in_torchs_path_keeps_its_backward_there(golden) -> None:
    # A forward through torch's path (oneDNN off) gives the global rows' log-sum-exp in
    # bfloat16; the backward (oneDNN on again) takes the forward's path, not the kernel
    # (whose backward once refused that log-sum-exp).
    q, k, v, upstream, valid = _inputs(1, 2, 256, 32, 32, (200,))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False  # (mkldnn.flags() warns about TF32 on Intel GPUs)
    try:
        out = block_sparse_attention(*leaves, valid, block_size=32, window=1, global_positions=(3, 150))
    finally:
        torch.backends.mkldnn.enabled = before
    (out.output * upstream).sum().backward()
    exact = _golden_with_grads(golden, q, k, v, upstream, valid, 32, 1, (3, 150))
    _assert_relative_errors_below(_with_grads(out.output, leaves), exact, 2e-2)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 3])
def test_any_number_of_threads(golden, dtype, threads) -> None:
    # The forward: each thread keeps its own running softmax for the global rows; the
    # merge must not depend on how the blocks were split (one thread: no merge; three:
    # uneven ranges that cut heads and batches). The backward: chunks of the threads share
    # key blocks with their neighbours (120 blocks: 8 chunks of 16), and threads sum the
    # global tokens' gradients over the heads of their blocks, merged at the end.
    q, k, v, upstream, valid = _inputs(2, 3, 640, 32, 64, (640, 300), dtype=dtype)
    case = (q, k, v, upstream, valid, 32, 1, (0, 333))
    with _threads(threads):
        mine = _attnlab_with_grads(*case)
    _assert_relative_errors_below(mine, _golden_with_grads(golden, *case), GRADIENT_TOLERANCE[dtype])


@needs_native
def test_finite_mask_values_stay_finite() -> None:
    # A mask of the dtype's lowest value (HuggingFace's convention) is a large finite bias:
    # scaled into base 2 it must not become -inf, or rows whose every key carries it
    # would get 0 where softmax gives their average.
    n, L, D = 4, 32, 32
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, L, D, generator=generator).bfloat16() for _ in range(3))
    window_bias = torch.zeros(n, 3 * L)
    window_bias[:, :L] = window_bias[:, 2 * L :] = float("-inf")  # each block alone
    window_bias[1] = torch.finfo(torch.bfloat16).min  # block 1: its window's keys all masked, finitely
    empty, no_bias = q.new_zeros(1, 0, D), torch.zeros(n, 0)
    output, logsumexp, _, _ = native.build().forward(
        q, k, v, -1, -1, 3, 1, n, window_bias, window_bias.ne(0).any(1), empty, empty, no_bias,
        empty, torch.zeros(1, n * L), D**-0.5,
    )
    expected = v[0:3].float().reshape(3 * L, D).mean(dim=0)  # equal scores: the average over its window
    torch.testing.assert_close(output[1].float(), expected.expand(L, D), atol=2e-2, rtol=2e-2)
    assert torch.isfinite(logsumexp).all()
    # The backward is finite and right for the other blocks' rows. (Rows whose every key
    # carries such a mask are padding rows: they get no gradient here, next to a bias that
    # large a float32 log-sum-exp cannot hold their normaliser. Their upstream is 0 here.)
    upstream = torch.randn(n, L, D, generator=generator).bfloat16()
    upstream[1] = 0
    no_rows = q.new_zeros(1, 0, D), torch.zeros(1, 0), torch.zeros(1, 0)
    arguments = (q, k, v, -1, -1, 3, 1, n, window_bias, window_bias.ne(0).any(1), upstream, output, logsumexp,
                 empty, empty, no_bias, empty, *no_rows, torch.zeros(1, n * L), D**-0.5)
    # the first three: there is no global token
    for mine, expected in zip(native.build().backward(*arguments)[:3], _reference_backward(*arguments)[:3]):
        assert torch.isfinite(mine).all()
        assert (mine.float() - expected.float()).abs().max() <= 1e-2 * expected.float().abs().max()


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nan_keys, masked_keys, globals_", [
    # Vector max may drop a NaN: the rows of query block 2 then saw a top of -inf with
    # finite scores left, and were exponentiated without their max (finite output next to
    # a log-sum-exp of -inf).
    ((64, 96), (96, 128), ()),
    # Every window key NaN, a global key finite: merging the global keys' maximum into the
    # window's (NaN) dropped the NaN, and the rows came out as the global value alone.
    ((32, 128), None, (200,)),
])
def test_nan_keys_never_give_finite_garbage(monkeypatch, dtype, nan_keys, masked_keys, globals_) -> None:
    # The rows of query block 2 (keys 32-127 in its window) must come out as no key (zero)
    # or NaN, never as finite numbers.
    calls = _count_native_calls(monkeypatch)
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, 256, 32, generator=generator).to(dtype) for _ in range(3))
    k[..., nan_keys[0] : nan_keys[1], :] = float("nan")
    valid = None
    if masked_keys:
        valid = torch.ones(1, 256, dtype=torch.bool)
        valid[:, masked_keys[0] : masked_keys[1]] = False
    with torch.no_grad():
        out = block_sparse_attention(q, k, v, valid, block_size=32, window=1, global_positions=globals_)
    rows = out.output[0, 0, 64:96].float()
    assert calls == [True]
    assert ((rows == 0) | rows.isnan()).all()


def _wrong_forward(*args):
    output, logsumexp, rows, row_logsumexp = _reference_kernel(*args)
    return output + 1, logsumexp, rows, row_logsumexp


def _wrong_backward(*args):
    grad_query, grad_key, grad_value, *global_grads = _reference_backward(*args)
    return grad_query, grad_key * 1.1, grad_value, *global_grads


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wrong", ["forward", "backward"])
def test_a_kernel_that_fails_its_check_is_not_used(golden, monkeypatch, dtype, wrong) -> None:
    # A kernel whose answer is wrong on this machine, forward or backward, is caught
    # before use: the layer falls back to torch's path (correct answer) and warns once.
    kernels = SimpleNamespace(forward=_reference_kernel, backward=_reference_backward)
    setattr(kernels, wrong, _wrong_forward if wrong == "forward" else _wrong_backward)
    monkeypatch.setattr(native, "build", lambda: kernels)
    monkeypatch.setattr(native, "_why_unavailable", lambda: None)
    monkeypatch.setattr(native, "_has_amx", lambda: True)
    native._passes_check.cache_clear()
    native._warn_once.cache_clear()
    try:
        q, k, v, upstream, valid = _inputs(1, 2, 256, 32, 32, (200,), dtype=dtype)
        case = (q, k, v, upstream, valid, 32, 1, ())
        with pytest.warns(RuntimeWarning, match="disagreed with float64 attention"):
            out, _, dk, _ = _attnlab_with_grads(*case)
        exact, _, exact_dk, _ = _golden_with_grads(golden, *case)
        _assert_relative_errors_below([out, dk], [exact, exact_dk], 2e-2)
    finally:
        native._passes_check.cache_clear()
        native._warn_once.cache_clear()


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_check_accepts_a_correct_kernel(monkeypatch, dtype) -> None:
    # The check's own reference: a plain-torch kernel with the same contract passes it, so
    # a rejection means a wrong answer, not a wrong check.
    monkeypatch.setattr(native, "build", lambda: SimpleNamespace(forward=_reference_kernel,
                                                                 backward=_reference_backward))
    native._passes_check.cache_clear()
    try:
        assert native._passes_check(dtype, 64, 32, 64, True)
        assert native._passes_check(dtype, 32, 32, 32, False)
    finally:
        native._passes_check.cache_clear()


@needs_native
@pytest.mark.parametrize("context", ["no_grad", "autograd_forward"])
def test_the_check_passes_where_autograd_is_off(context) -> None:
    # Regression: the check's float64 reference used autograd, which is off under
    # torch.no_grad and inside an autograd function's forward (where the layer first
    # calls it): the check failed there and the kernel was never used.
    class CheckInForward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.new_tensor(float(native._check(torch.float32, 32, 32, 32, True)))

        @staticmethod
        def backward(ctx, grad):
            return grad

    if context == "no_grad":
        with torch.no_grad():
            assert native._check(torch.float32, 32, 32, 32, True)
    else:
        assert CheckInForward.apply(torch.zeros(1, requires_grad=True)).item() == 1.0


def test_without_the_kernel_bfloat16_takes_torchs_path_and_says_why_once(golden, monkeypatch) -> None:
    monkeypatch.setattr(native, "_has_amx", lambda: True)  # where it should serve
    monkeypatch.setattr(native, "_why_unavailable", lambda: "no C++ compiler")
    native._warn_once.cache_clear()
    try:
        q, k, v, _, _ = _inputs(1, 2, 256, 32, 32, None)
        with pytest.warns(RuntimeWarning, match="not available \\(no C\\+\\+ compiler\\)"):
            out = block_sparse_attention(q, k, v, block_size=32, window=1).output
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process, not per call
            block_sparse_attention(q, k, v, block_size=32, window=1)
        reference = golden.block_sparse(q, k, v, None, 32, 1, ())
        assert (out.double() - reference).abs().max() / reference.abs().max() < 2e-2
    finally:
        native._warn_once.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_head_dim_other_than_key_head_dim(golden, dtype) -> None:
    # Regression: torch's fused kernel takes one head dim; values of another width sent
    # the forward there and failed ("Q/K/V should have the same head size").
    generator = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, 2, 200, 8, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(2, 2, 200, 12, generator=generator, dtype=dtype)
    valid = torch.arange(200)[None] < torch.tensor([200, 150])[:, None]
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = block_sparse_attention(*leaves, valid, block_size=16, window=1, global_positions=(3, 120)).output
    out.sum().backward()
    reference_leaves = [x.double().clone().requires_grad_(True) for x in (q, k, v)]
    reference = golden.block_sparse(*reference_leaves, valid, 16, 1, (3, 120))
    reference.sum().backward()
    tolerance = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-9}
    torch.testing.assert_close(out.double(), reference, **tolerance)
    for leaf, reference_leaf in zip(leaves, reference_leaves):
        torch.testing.assert_close(leaf.grad.double(), reference_leaf.grad, **tolerance)


def _reference_kernel(
    query, key_source, value_source, shift, value_shift, spread, heads, blocks, window_bias, biased,
    global_keys, global_values, global_bias, global_queries, key_bias, scale,
):
    """The native operator's contract in plain float32 torch (slow; for the check's tests)."""
    n, L, D = query.shape
    Dv, W = value_source.shape[-1], spread * L
    flat_keys = key_source.float().reshape(-1, D)
    flat_values = value_source.float().reshape(-1, Dv)
    columns = (torch.arange(n)[:, None] + shift) * L + torch.arange(W)  # [n, W] source rows
    value_columns = columns + (value_shift - shift) * L
    inside = (columns >= 0) & (columns < flat_keys.shape[0])
    keys = flat_keys[columns.clamp(0, flat_keys.shape[0] - 1)]  # [n, W, D]
    values = flat_values[value_columns.clamp(0, flat_values.shape[0] - 1)]  # [n, W, Dv]
    head = torch.arange(n) // blocks
    row = (torch.arange(n) // (heads * blocks)) * blocks + torch.arange(n) % blocks
    bias = window_bias[row].masked_fill(~inside, float("-inf"))  # [n, W]
    keys = torch.cat([keys, global_keys.float()[head]], dim=1)
    values = torch.cat([values, global_values.float()[head]], dim=1)
    bias = torch.cat([bias, global_bias[row]], dim=1)[:, None, :]  # [n, 1, W + G]
    scores = torch.baddbmm(bias, query.float(), keys.transpose(1, 2), alpha=scale)
    logsumexp = scores.logsumexp(dim=-1)
    output = torch.softmax(scores.nan_to_num(neginf=-1e30), dim=-1) @ values
    output = output.masked_fill(logsumexp[..., None] == float("-inf"), 0)
    # The global rows over every key of their head.
    B = key_bias.shape[0]
    own, own_value = shift + spread // 2, value_shift + spread // 2  # source block of block 0's own keys
    every_key = key_source.float()[own : own + n].reshape(B * heads, -1, D)  # [B H, N L, D]
    every_value = value_source.float()[own_value : own_value + n].reshape(B * heads, -1, Dv)
    row_scores = torch.bmm(global_queries.float(), every_key.transpose(1, 2)) * scale
    row_scores = row_scores + key_bias.repeat_interleave(heads, dim=0)[:, None, :]
    row_logsumexp = row_scores.logsumexp(dim=-1)
    rows = torch.softmax(row_scores.nan_to_num(neginf=-1e30), dim=-1) @ every_value
    rows = rows.masked_fill(row_logsumexp[..., None] == float("-inf"), 0)  # no key: 0
    return output.to(query.dtype), logsumexp, rows.to(query.dtype), row_logsumexp


def _reference_backward(
    query, key_source, value_source, shift, value_shift, spread, heads, blocks, window_bias, biased,
    grad_output, output, logsumexp, global_keys, global_values, global_bias, global_queries,
    global_grad_output, global_row_term, global_logsumexp, key_bias, scale,
):
    """The native backward's contract in plain float32 torch: autograd through ``_reference_kernel``.

    The block rows replaced by the global tokens' rows (log-sum-exp ``+inf``) take no
    gradient; the global tokens' keys, values and queries get theirs apart, in float32.
    """
    n, L, D = query.shape
    leaves = [x.float().requires_grad_(True) for x in (query, key_source, value_source, global_keys,
                                                       global_values, global_queries)]
    with torch.enable_grad():
        block_output, _, row_output, _ = _reference_kernel(
            leaves[0], leaves[1], leaves[2], shift, value_shift, spread, heads, blocks, window_bias, biased,
            leaves[3], leaves[4], global_bias, leaves[5], key_bias, scale,
        )
        upstream = grad_output.float().masked_fill(logsumexp[..., None] == float("inf"), 0)
        ((block_output * upstream).sum() + (row_output * global_grad_output.float()).sum()).backward()
    own, own_value = shift + spread // 2, value_shift + spread // 2  # source block of block 0's own keys
    grad_query, grad_keys, grad_values, global_key_grad, global_value_grad, global_query_grad = (
        leaf.grad for leaf in leaves
    )
    dtype = query.dtype
    grad_keys, grad_values = grad_keys[own : own + n], grad_values[own_value : own_value + n]
    return (grad_query.to(dtype), grad_keys.to(dtype), grad_values.to(dtype),
            global_key_grad, global_value_grad, global_query_grad)
