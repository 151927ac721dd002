"""attnlab's native in-place causal softmax (``_native/causal_softmax.cpp``) and the zeroed
large buffers the kept weights are written into: the numbers of a float64 softmax, on
every vector width this machine can run."""

from __future__ import annotations

import pytest
import torch

from attnlab import _large_buffers, _native

needs_kernel = pytest.mark.skipif(_native.unavailable_reason("causal_softmax") is not None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")


def _reference(scores: torch.Tensor, first_row: int) -> torch.Tensor:
    t, keys = scores.shape[-2:]
    allowed = torch.arange(keys)[None, :] <= torch.arange(t)[:, None] + first_row
    weights = scores.double().masked_fill(~allowed, float("-inf")).softmax(-1)
    return weights.nan_to_num(0.0)  # a row with no key: zeros


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 37, 53), (1, 4, 64, 1024), (3, 2, 5, 17)])
@pytest.mark.parametrize("first_row", [0, 5, 40, -3])
def test_equals_a_float64_causal_softmax(shape, first_row):
    generator = torch.Generator().manual_seed(sum(shape) + first_row)
    scores = torch.randn(shape, generator=generator) * 6
    out = _native.build("causal_softmax").causal_softmax_(scores.clone(), first_row)
    assert (out.double() - _reference(scores, first_row)).abs().max() < 1e-6


@needs_kernel
def test_writes_in_place_into_a_view_and_nothing_past_it():
    full = torch.full((2, 3, 40, 40), 7.0)
    scores = torch.randn(2, 3, 8, 24)
    view = full[:, :, 16:24, :24]
    view.copy_(scores)
    result = _native.build("causal_softmax").causal_softmax_(view, 16)
    assert result.data_ptr() == view.data_ptr()
    assert (full[:, :, 16:24, :24].double() - _reference(scores, 16)).abs().max() < 1e-6
    untouched = torch.ones_like(full, dtype=torch.bool)
    untouched[:, :, 16:24, :24] = False
    assert (full[untouched] == 7.0).all()


@needs_kernel
def test_refuses_what_it_cannot_compute():
    kernel = _native.build("causal_softmax").causal_softmax_
    with pytest.raises(RuntimeError, match="float32"):
        kernel(torch.zeros(1, 1, 2, 2, dtype=torch.float64), 0)
    with pytest.raises(RuntimeError, match="contiguous along keys"):
        kernel(torch.zeros(1, 1, 2, 4)[..., ::2], 0)


@needs_kernel
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="only a CPU with AVX-512 has a second vector width to build for")
def test_the_avx2_build_gives_the_same_numbers(run_python):
    script = """
        import torch
        from attnlab import _native
        torch.manual_seed(0)
        for shape, first in [((2, 3, 37, 53), 4), ((1, 2, 64, 1024), 900), ((1, 1, 3, 9), -1)]:
            scores = torch.randn(shape) * 6
            t, keys = shape[-2:]
            allowed = torch.arange(keys)[None, :] <= torch.arange(t)[:, None] + first
            want = scores.double().masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
            got = _native.build("causal_softmax").causal_softmax_(scores.clone(), first)
            assert (got.double() - want).abs().max() < 1e-6, shape
        print(_native.status("causal_softmax"))
    """
    stdout = run_python(script, ATEN_CPU_CAPABILITY="avx2")
    assert stdout.strip() == "ready (AVX2)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("numel", [10, _large_buffers.LARGE_BYTES])  # torch's zeros, and mapped afresh
def test_large_buffers_are_zeroed_writable_tensors_that_outlive_their_views(dtype, numel):
    shape = (2, numel // 2)
    buffer = _large_buffers.zeros(shape, dtype)
    assert buffer.shape == shape and buffer.dtype == dtype and not buffer.any()
    buffer[1, -3:] = 2.0
    tail = buffer[1, -3:]
    del buffer
    assert torch.equal(tail, torch.full((3,), 2.0, dtype=dtype))


def test_the_native_switch_takes_on_and_off_words_and_refuses_a_typo(monkeypatch):
    for value, on in [("0", False), ("off", False), ("1", True), ("Yes", True), ("", True)]:
        monkeypatch.setenv("ATTNLAB_NATIVE", value)
        assert _native.enabled() is on, value
    monkeypatch.setenv("ATTNLAB_NATIVE", "of")
    with pytest.raises(ValueError, match="ATTNLAB_NATIVE='of' is not one of 1, on, true, yes, 0, off"):
        _native.enabled()
