"""Dynamic time warping and the alignment matrix against independent references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.inspect.compute.time_alignment import alignment_matrix, dtw_path, median_filter


def _reference_cost(cost: np.ndarray) -> float:
    """The least total cost of a monotone path, a plain float64 DP filled row by row."""
    rows, columns = cost.shape
    best = [[0.0] * columns for _ in range(rows)]
    for i in range(rows):
        for j in range(columns):
            before = [best[a][b] for a, b in ((i - 1, j - 1), (i - 1, j), (i, j - 1)) if a >= 0 and b >= 0]
            best[i][j] = float(cost[i, j]) + (min(before) if before else 0.0)
    return best[-1][-1]


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (5, 40), (12, 30), (9, 9)])
def test_the_path_is_monotone_spans_the_matrix_and_costs_the_least(shape):
    cost = np.random.default_rng(sum(shape)).normal(size=shape)
    rows, columns = dtw_path(cost)
    assert (rows[0], columns[0]) == (0, 0) and (rows[-1], columns[-1]) == (shape[0] - 1, shape[1] - 1)
    steps = np.stack([np.diff(rows), np.diff(columns)], 1)
    assert all(tuple(step) in {(1, 0), (0, 1), (1, 1)} for step in steps)
    assert cost[rows, columns].sum() == pytest.approx(_reference_cost(cost), abs=1e-9)


def test_a_diagonal_valley_is_followed_exactly():
    cost = np.ones((4, 8))
    for i, (a, b) in enumerate([(0, 2), (2, 4), (4, 6), (6, 8)]):
        cost[i, a:b] = 0.0
    rows, columns = dtw_path(cost)
    assert [int(columns[rows == i].min()) for i in range(4)] == [0, 2, 4, 6]


def test_the_median_filter_is_a_reflected_running_median():
    values = np.random.default_rng(0).normal(size=(2, 3, 20))
    got = median_filter(values, 7)
    padded = np.concatenate([values[..., 3:0:-1], values, values[..., -2:-5:-1]], -1)
    want = np.array([[[np.median(row[p:p + 7]) for p in range(20)] for row in head] for head in padded])
    np.testing.assert_allclose(got, want)
    np.testing.assert_array_equal(median_filter(values[..., :3], 7), values[..., :3])
    with pytest.raises(ValueError, match="odd"):
        median_filter(values, 4)


def test_the_matrix_renormalises_over_the_clip_and_standardises_over_rows():
    logits = torch.randn(2, 5, 30, dtype=torch.float64)
    weights = logits.softmax(-1)
    clip = logits[..., :12].softmax(-1)  # a softmax over the clip's positions alone
    standard = (clip - clip.mean(-2, keepdim=True)) / clip.std(-2, unbiased=False, keepdim=True)
    want = median_filter(standard.numpy(), 1).mean(0)
    np.testing.assert_allclose(alignment_matrix(weights, 12, median_width=1), want, atol=1e-12)
    with pytest.raises(ValueError, match="positions must lie in 1..30"):
        alignment_matrix(weights, 31)
