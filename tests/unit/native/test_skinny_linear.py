"""attnlab's native few-row product (``attnlab._skinny``): the numbers of a float64 product,
on every vector width this machine can run, and the routing that decides when it serves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import _native
from attnlab._precision import Linear
from attnlab._skinny import MAX_ROWS, skinny_kernel_status, skinny_linear

needs_kernel = pytest.mark.skipif(_native.unavailable_reason("skinny_linear") is not None,
                                  reason="the native kernel cannot be built here (no compiler or ninja)")


def _reference(x, weight, bias):
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8])
@pytest.mark.parametrize("depth,width", [(768, 2048), (100, 37), (7, 5), (1027, 9)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_equals_a_float64_product(rows, depth, width, with_bias):
    generator = torch.Generator().manual_seed(rows * 1000 + depth + width)
    x = torch.randn(rows, depth, generator=generator)
    weight = torch.randn(width, depth, generator=generator)
    bias = torch.randn(width, generator=generator) if with_bias else None
    out = skinny_linear(x, weight, bias)
    assert out is not None and out.dtype == torch.float32 and out.shape == (rows, width)
    # float32 sums of `depth` products: a few units of rounding of the largest partial sums
    scale = (x.abs().double() @ weight.abs().double().T).max()
    assert ((out.double() - _reference(x, weight, bias)).abs().max() / scale) < 1e-6


@needs_kernel
@pytest.mark.parametrize("rows", [12, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_rows_than_the_decoding_step_takes_still_give_a_float64_product(rows, dtype):
    """Past two passes of rows over each group of weight rows: the earlier passes ask for no
    rows ahead, the last two for half the next rows each (the kernel itself, which takes any
    number of rows; depths with and without a tail past the lines asked for)."""
    kernel = _native.build("skinny_linear")
    for depth, width in ((768, 45), (301, 7)):
        generator = torch.Generator().manual_seed(rows + depth)
        x = torch.randn(rows, depth, generator=generator)
        weight = torch.randn(width, depth, generator=generator).to(dtype)
        out = kernel.linear(x, weight, None)
        scale = (x.abs().double() @ weight.abs().double().T).max()
        assert ((out.double() - _reference(x, weight, None)).abs().max() / scale) < 1e-6


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_width_weights_give_a_gemm_s_numbers_in_their_dtype(rows, dtype):
    """bfloat16 (float16) operands, float32 sums, one rounding to the dtype at the end; a depth
    that leaves a tail of fewer than one vector of weights to widen."""
    generator = torch.Generator().manual_seed(rows)
    x, weight, bias = (torch.randn(*shape, generator=generator).to(dtype)
                       for shape in ((rows, 300), (70, 300), (70,)))
    out = skinny_linear(x, weight, bias)
    assert out.dtype == dtype
    exact = _reference(x, weight, bias)
    # within one rounding (half the dtype's eps, relative) of the exact sum of the operands
    assert ((out.double() - exact).abs() <= exact.abs() * torch.finfo(dtype).eps / 2 + 1e-3).all()


@needs_kernel
def test_leading_dims_and_strided_inputs_keep_their_shape():
    x = torch.randn(2, 1, 3, 64)[:, :, :, :48]  # not contiguous
    weight = torch.randn(96, 48 * 2)[:, ::2]  # not contiguous either
    out = skinny_linear(x, weight, None)
    assert out.shape == (2, 1, 3, 96)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-5)
    # a strided bias, made contiguous for the kernel
    x, weight, bias = torch.randn(1, 1, 48), torch.randn(96, 48), torch.randn(96 * 2)[::2]
    torch.testing.assert_close(skinny_linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_serves_only_few_rows_without_gradients_in_float32():
    weight = torch.randn(16, 32)
    assert skinny_linear(torch.randn(MAX_ROWS + 1, 32), weight, None) is None
    assert skinny_linear(torch.randn(2, 32, dtype=torch.float64), weight.double(), None) is None
    assert skinny_linear(torch.randn(2, 32), weight.bfloat16(), None) is None  # mixed dtypes
    assert skinny_linear(torch.randn(2, 32, requires_grad=True), weight, None) is None
    assert skinny_linear(torch.randn(0, 32), weight, None) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert skinny_linear(torch.randn(2, 32), weight, None) is None


@needs_kernel
def test_linear_layers_route_decoding_products_to_the_kernel_and_keep_gradients(monkeypatch):
    import attnlab._precision as precision

    served = []
    real = precision.skinny_linear
    monkeypatch.setattr(precision, "skinny_linear",
                        lambda x, w, b: served.append(out := real(x, w, b)) or out)
    torch.manual_seed(0)
    layer = Linear(64, 48)
    x = torch.randn(3, 64, requires_grad=True)
    with torch.no_grad():
        fast = layer(x)
    assert served[-1] is not None
    slow = layer(x)  # training: torch's product, which has a backward
    assert served[-1] is None
    slow.sum().backward()
    assert x.grad is not None and layer.weight.grad is not None
    torch.testing.assert_close(fast, slow.detach(), rtol=1e-5, atol=1e-5)


def test_the_switch_turns_the_kernel_off(run_python):
    """ATTNLAB_NATIVE=0: no kernel is built or used, and the products are torch's, bit for bit."""
    script = """
        import torch, torch.nn.functional as F
        from attnlab._skinny import skinny_kernel_status, skinny_linear
        from attnlab._precision import Linear
        layer = Linear(32, 16)
        x = torch.randn(2, 32)
        with torch.no_grad():
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert skinny_linear(x, layer.weight, None) is None
        print(skinny_kernel_status())
    """
    stdout = run_python(script, ATTNLAB_NATIVE="0")
    assert stdout.strip() == "turned off by ATTNLAB_NATIVE=0"


@needs_kernel
@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512",
                    reason="only a CPU with AVX-512 has a second vector width to build for")
def test_the_avx2_build_gives_the_same_numbers(run_python):
    """The same source built for AVX2 (what torch dispatches to under ATEN_CPU_CAPABILITY=avx2,
    as on a CPU without AVX-512): a float64 product's numbers again."""
    script = """
        import torch, torch.nn.functional as F
        from attnlab._skinny import skinny_kernel_status, skinny_linear
        torch.manual_seed(0)
        for rows, depth, width in [(1, 768, 2048), (5, 1027, 9), (8, 7, 33)]:
            x, weight, bias = torch.randn(rows, depth), torch.randn(width, depth), torch.randn(width)
            out = skinny_linear(x, weight, bias)
            scale = (x.abs().double() @ weight.abs().double().T).max()
            error = (out.double() - F.linear(x.double(), weight.double(), bias.double())).abs().max() / scale
            assert error < 1e-6, (rows, depth, width, float(error))
        print(skinny_kernel_status())
    """
    stdout = run_python(script, ATEN_CPU_CAPABILITY="avx2")
    assert stdout.strip() == "ready (AVX2)"
    assert skinny_kernel_status() == "ready (AVX512)"
