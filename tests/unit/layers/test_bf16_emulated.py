"""bfloat16 on CPUs that would emulate it: Linear through float32 GEMMs, attention in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab._precision as precision
from attnlab import TransformerEncoder
from attnlab._precision import linear
from attnlab.attention import attention
from attnlab.layers import Linear


@pytest.fixture
def emulated(monkeypatch):
    """Behave as on a CPU without native bfloat16, whatever this one has."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)


@pytest.fixture
def kernel_dtypes(monkeypatch) -> list:
    """The query dtype of every call to torch's fused attention kernel, in order."""
    seen = []
    kernel = F.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        seen.append(query.dtype)
        return kernel(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def _bf16_autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _leaves(*shape_sets):
    torch.manual_seed(0)
    return [torch.randn(*shape, requires_grad=True) for shape in shape_sets]


@pytest.mark.parametrize("bias", [True, False])
def test_output_and_gradients_equal_torchs_bf16_linear(emulated, bias) -> None:
    x, w, b = _leaves((3, 37, 64), (48, 64), (48,))
    b = b if bias else None
    grad = torch.randn(3, 37, 48)
    inputs = (x, w) + ((b,) if bias else ())
    with _bf16_autocast():
        ours = linear(x, w, b)
        theirs = F.linear(x, w, b)  # autocast's own bfloat16 linear
    assert ours.dtype == theirs.dtype == torch.bfloat16
    # Same operands, float32 accumulation in both: at most one bfloat16 rounding step apart.
    torch.testing.assert_close(ours, theirs, rtol=2**-7, atol=1e-6)
    ours_grads = torch.autograd.grad(ours, inputs, grad)
    for ours_grad, their_grad in zip(ours_grads, torch.autograd.grad(theirs, inputs, grad)):
        assert ours_grad.dtype == their_grad.dtype == torch.float32
        tolerance = 1e-5 * their_grad.abs().max().item()
        torch.testing.assert_close(ours_grad, their_grad, rtol=2**-7, atol=tolerance)


def test_bf16_inputs_get_bf16_gradients(emulated) -> None:
    x = torch.randn(5, 16, dtype=torch.bfloat16, requires_grad=True)
    layer = Linear(16, 8)
    with _bf16_autocast():
        out = layer(x)
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.float32


def test_float32_gemm_path_runs_only_where_torch_would_emulate(monkeypatch) -> None:
    def refuse(*args):
        raise AssertionError("the float32-GEMM path ran")

    monkeypatch.setattr(precision._BF16LinearViaFP32, "apply", refuse)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=0, atol=0)  # no autocast
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    with _bf16_autocast():
        assert linear(x, w).dtype == torch.bfloat16  # native: torch's own kernel
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    with _bf16_autocast(), pytest.raises(AssertionError, match="float32-GEMM path ran"):
        linear(x, w)


def test_linear_keeps_nn_linear_parameters_and_state_dict() -> None:
    reference = nn.Linear(6, 4)
    ours = Linear(6, 4)
    ours.load_state_dict(reference.state_dict())
    assert isinstance(ours, nn.Linear) and list(ours.state_dict()) == ["weight", "bias"]
    x = torch.randn(2, 6)
    torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)


def test_encoder_training_step_in_bf16_matches_torchs_kernels(emulated, monkeypatch) -> None:
    torch.manual_seed(0)
    model = TransformerEncoder(50, d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0, pad_id=0)
    ids = torch.randint(1, 50, (3, 10))
    ids[1, 6:] = 0
    real = ids != 0

    def step():
        model.zero_grad(set_to_none=True)
        with _bf16_autocast():
            hidden = model(ids).last_hidden_state
        loss = hidden.float()[real].square().mean()
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    ours_loss, ours_grads = step()
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)  # torch's own bf16 kernels
    their_loss, their_grads = step()
    torch.testing.assert_close(ours_loss, their_loss, rtol=2e-2, atol=0)
    for name, grad in their_grads.items():
        scale = grad.abs().max().item()
        torch.testing.assert_close(ours_grads[name], grad, rtol=0, atol=5e-2 * scale + 1e-8, msg=name)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "weights"])
def test_bf16_attention_is_computed_in_float32_and_returned_in_bf16(emulated, need_weights) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    mask[1, :, 4] = False  # a fully masked query row
    mask[0, :, :, 5:] = False
    with _bf16_autocast():
        out, weights = attention(q, k, v, mask, need_weights=need_weights)
    assert out.dtype == torch.bfloat16 and (weights is None or weights.dtype == torch.bfloat16)
    # float64 reference on the same bfloat16 inputs: float32 arithmetic is exact up to the
    # final rounding to bfloat16 (relative 2^-8), which torch's bfloat16 kernel is not.
    golden, golden_weights = attention(q.double(), k.double(), v.double(), mask, need_weights=True)
    torch.testing.assert_close(out.double(), golden, rtol=2**-8, atol=1e-6)
    assert not out[1, :, 4].any()
    if need_weights:
        torch.testing.assert_close(weights.double(), golden_weights, rtol=2**-8, atol=1e-6)
    out.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad.float()).all()
               for t in (q, k, v))


def test_bf16_attention_keeps_torchs_kernel_where_bf16_is_native(monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    q = torch.randn(1, 2, 5, 8).bfloat16()
    expected = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(attention(q, q, q).output, expected, rtol=0, atol=0)


def test_bf16_attention_calls_torchs_kernel_in_float32_where_bf16_is_emulated(
    emulated, kernel_dtypes
) -> None:
    q = torch.randn(1, 2, 5, 8).bfloat16()
    with _bf16_autocast():
        attention(q, q, q)
    assert kernel_dtypes == [torch.float32]


@pytest.mark.parametrize("by_sequence", [True, False], ids=["by-sequence", "padded-layout"])
def test_packed_encoder_attends_in_float32_where_bf16_is_emulated(
    emulated, kernel_dtypes, monkeypatch, by_sequence
) -> None:
    from attnlab.attention import packing as packing_module

    monkeypatch.setattr(packing_module, "PADDING_WORK_PER_CALL", 0 if by_sequence else 10**18)
    model = TransformerEncoder(50, d_model=32, num_layers=2, num_heads=4, d_ff=64, pad_id=0)
    ids = torch.randint(1, 50, (3, 10))
    ids[1, 6:] = 0
    with _bf16_autocast():
        hidden = model(ids).last_hidden_state
    hidden.float().square().mean().backward()
    assert kernel_dtypes and set(kernel_dtypes) == {torch.float32}
    # One call per sequence and layer, or one per layer.
    assert len(kernel_dtypes) == (2 * 3 if by_sequence else 2)


def test_float64_is_left_alone_under_bf16_autocast(emulated) -> None:
    x, w = torch.randn(4, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    with _bf16_autocast():
        ours, theirs = linear(x, w), F.linear(x, w)
    assert ours.dtype == theirs.dtype == torch.float64
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_float32_route_validates_the_mask_before_attending(emulated) -> None:
    q = torch.randn(1, 1, 3, 4).bfloat16()
    with pytest.raises(TypeError, match="holding -inf besides 0 and 1"):
        attention(q, q, q, torch.full((3, 3), float("-inf"), dtype=torch.float16))


def test_a_bfloat16_linear_outside_autocast_runs_float32_products_with_bfloat16_numbers(emulated, monkeypatch):
    """A bfloat16 model's prompt pass: the products of the rounded operands, exact in float32, summed
    in float32 and rounded once, as a bfloat16 GEMM with float32 accumulation gives them."""
    calls = []
    real = F.linear
    monkeypatch.setattr(F, "linear", lambda x, w, b=None: calls.append(x.dtype) or real(x, w, b))
    x = torch.randn(40, 96).to(torch.bfloat16)
    weight, bias = torch.randn(48, 96).to(torch.bfloat16), torch.randn(48).to(torch.bfloat16)
    out = linear(x, weight, bias)
    assert out.dtype == torch.bfloat16 and calls == [torch.float32]  # no emulated bfloat16 GEMM
    exact = x.double() @ weight.double().t() + bias.double()
    assert torch.allclose(out.double(), exact, rtol=2 ** -8, atol=1e-2)
    assert torch.equal(out, (x.float() @ weight.float().t() + bias.float()).to(torch.bfloat16))
