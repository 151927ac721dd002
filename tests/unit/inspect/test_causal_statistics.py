"""Causal statistics: entropy over the allowed prefix, sink mass, mean attended distance."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.inspect.compute.causal_statistics import causal_statistics


def _uniform_causal(T: int) -> torch.Tensor:
    weights = torch.tril(torch.ones(T, T))
    return (weights / weights.sum(-1, keepdim=True))[None, None]  # [1, 1, T, T]


def test_uniform_over_the_prefix_has_normalized_entropy_one():
    stats = causal_statistics({"layer_1": _uniform_causal(6)})
    assert stats["normalized_entropy"]["layer_1"] == [pytest.approx(1.0)]
    # rows t = 1..5 put 1/(t+1) on the first token and look back t/2 on average
    assert stats["sink_mass"]["layer_1"] == [pytest.approx(sum(1 / (t + 1) for t in range(1, 6)) / 5)]
    assert stats["mean_distance"]["layer_1"] == [pytest.approx(sum(t / 2 for t in range(1, 6)) / 5)]


def test_all_mass_on_the_first_token_is_a_full_sink():
    weights = torch.zeros(1, 2, 5, 5)
    weights[..., 0] = 1.0
    stats = causal_statistics({"layer_1": weights})
    assert stats["sink_mass"]["layer_1"] == [pytest.approx(1.0)] * 2
    assert stats["normalized_entropy"]["layer_1"] == [pytest.approx(0.0, abs=1e-9)] * 2


def test_left_padding_counts_only_real_tokens():
    padded = torch.zeros(1, 1, 6, 6)
    padded[..., 2:, 2:] = _uniform_causal(4)[0, 0]
    keep = torch.tensor([[0, 0, 1, 1, 1, 1]])
    assert causal_statistics({"layer_1": padded}, keep) == causal_statistics({"layer_1": _uniform_causal(4)})


def test_bad_mask_shape_is_refused():
    with pytest.raises(ValueError, match="attention_mask must be"):
        causal_statistics({"layer_1": _uniform_causal(4)}, torch.ones(1, 3))


def test_log_of_prefix_size_is_the_normaliser():
    row = torch.tensor([0.5, 0.5, 0.0])
    weights = torch.zeros(1, 1, 3, 3)
    weights[0, 0, 0, 0] = 1.0
    weights[0, 0, 1, :2] = 0.5
    weights[0, 0, 2] = row
    stats = causal_statistics({"layer_1": weights})
    assert stats["normalized_entropy"]["layer_1"][0] == pytest.approx((1.0 + math.log(2) / math.log(3)) / 2)


def test_any_split_into_batches_gives_the_same_means():
    from attnlab.inspect.compute.causal_statistics import CausalStatistics

    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(4, 2, 6, 6).masked_fill(~torch.tril(torch.ones(6, 6, dtype=torch.bool)),
                                                               float("-inf")), -1)
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[1, :2] = False
    whole = causal_statistics({"layer_1": weights}, keep)
    split = CausalStatistics()
    for rows in (slice(0, 1), slice(1, 4)):
        split.update("layer_1", weights[rows], keep[rows])
    for name, layers in whole.items():
        assert split.means()[name]["layer_1"] == pytest.approx(layers["layer_1"])
