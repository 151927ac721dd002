"""``torch.autograd.gradcheck`` in float64 on ``attnlab.attention.attention``.

Both paths (fused: ``need_weights=False``; reference: ``need_weights=True``, whose
weights are checked as a second output) and every mask kind, including a row that may
attend to no key at all: its output is identically zero, so its gradient must be zero
(not NaN), and finite differences agree with that. ``fast_mode`` checks random
projections of the Jacobian, which keeps the file to a few seconds.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import attention, causal_mask

B, H, T, S, D = 1, 2, 3, 4, 3


def _masks() -> dict[str, tuple[torch.Tensor | None, bool]]:
    bool_mask = torch.tensor(
        [[True, False, True, True], [False, False, False, False], [True, True, False, False]]
    )  # [T, S]; query 1 has no key
    additive = torch.tensor(
        [[0.5, float("-inf"), -1.0, 0.0], [float("-inf")] * 4, [0.0, 2.0, float("-inf"), 0.3]],
        dtype=torch.float64,
    )
    padding = torch.tensor([True, True, False, False])[None, None, None, :]  # [1, 1, 1, S]
    return {
        "none": (None, False),
        "bool_with_empty_row": (bool_mask, False),
        "float_with_empty_row": (additive, False),
        "causal_flag": (None, True),
        "causal_mask": (causal_mask(T, S), False),
        "padding_and_causal": (padding, True),
        "all_masked": (torch.zeros(T, S, dtype=torch.bool), False),
    }


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
@pytest.mark.parametrize("kind", list(_masks()))
def test_gradcheck(kind: str, need_weights: bool) -> None:
    mask, is_causal = _masks()[kind]
    q = torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, S, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, S, D, dtype=torch.float64, requires_grad=True)

    def function(q, k, v):
        masks = {"attn_bias": mask} if mask is not None and mask.dtype.is_floating_point else {"mask": mask}
        out, weights = attention(q, k, v, **masks, is_causal=is_causal, need_weights=need_weights)
        return (out, weights) if need_weights else out

    assert torch.autograd.gradcheck(function, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "reference"])
def test_full_jacobian_gradcheck_with_fully_masked_row(need_weights: bool) -> None:
    """The whole Jacobian (not random projections) on a tiny case with an empty row."""
    mask = torch.tensor([[True, False, True], [False, False, False]])  # [T, S]; query 1 has no key
    q = torch.randn(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 2, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 3, 2, dtype=torch.float64, requires_grad=True)

    def function(q, k, v):
        out, weights = attention(q, k, v, mask, need_weights=need_weights)
        return (out, weights) if need_weights else out

    assert torch.autograd.gradcheck(function, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)
