"""Attention rollout on crafted maps."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect import attention_rollout


def test_two_layer_rollout_by_hand():
    # layer 1: head 1 sends everything to token 0, head 2 is the identity
    layer_1 = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])[None]  # [1, 2, 2, 2]
    # layer 2: both heads send everything to token 1
    layer_2 = torch.tensor([[0.0, 1.0], [0.0, 1.0]]).expand(1, 2, 2, 2)
    rollout = attention_rollout({"layer_1": layer_1, "layer_2": layer_2})
    # mean of heads [[1, 0], [.5, .5]] -> 0.5 A + 0.5 I = [[1, 0], [.25, .75]]
    first = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    # layer 2: 0.5 [[0, 1], [0, 1]] + 0.5 I = [[.5, .5], [0, 1]]; rollout = that @ first
    second = torch.tensor([[0.5 + 0.125, 0.375], [0.25, 0.75]])
    assert rollout.shape == (2, 1, 2, 2)
    assert torch.allclose(rollout[0, 0], first)
    assert torch.allclose(rollout[1, 0], second)
    assert torch.allclose(rollout.sum(-1), torch.ones(2, 1, 2))


def test_padding_does_not_change_the_real_block():
    torch.manual_seed(0)
    real = [torch.softmax(torch.randn(1, 3, 4, 4), -1) for _ in range(3)]
    padded = []
    for weights in real:
        full = torch.rand(1, 3, 6, 6)
        full[:, :, :4, :4] = weights
        full[:, :, :4, 4:] = 0.0
        padded.append(full)
    mask = torch.tensor([[True] * 4 + [False] * 2])
    expected = attention_rollout(real)
    got = attention_rollout(padded, mask)
    assert torch.allclose(got[:, :, :4, :4], expected, atol=1e-6)
    assert torch.allclose(got[:, :, :4, 4:], torch.zeros(3, 1, 4, 2))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="empty"):
        attention_rollout([])
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout([torch.ones(1, 1, 2, 2) / 2], head_fusion="median")
    with pytest.raises(ValueError, match="self-attention"):
        attention_rollout([torch.ones(1, 1, 2, 3) / 3])
