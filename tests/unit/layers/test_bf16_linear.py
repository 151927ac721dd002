"""bfloat16 Linear through float32 GEMMs on CPUs that would emulate it: torch's numbers, fast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab._precision as precision
from attnlab import TransformerEncoder
from attnlab._precision import Linear, linear


@pytest.fixture
def emulated(monkeypatch):
    """Behave as on a CPU without native bfloat16, whatever this one has."""
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)


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
    for ours_grad, their_grad in zip(torch.autograd.grad(ours, inputs, grad), torch.autograd.grad(theirs, inputs, grad)):
        assert ours_grad.dtype == their_grad.dtype == torch.float32
        torch.testing.assert_close(ours_grad, their_grad, rtol=2**-7, atol=1e-5 * their_grad.abs().max().item())


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
