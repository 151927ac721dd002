"""A region's share of patch attention, and the artifact-token detector, on constructed cases."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.compute.artifact_tokens import find_artifact_tokens
from attnlab.inspect.compute.patch_regions import patch_coverage, region_share


def test_patch_coverage_is_each_patchs_covered_share():
    mask = torch.zeros(4, 6, dtype=torch.bool)  # 2 x 3 patches of 2 px
    mask[0:2, 0:2] = True  # patch (0, 0) whole
    mask[2, 4] = True  # a quarter of patch (1, 2)
    coverage = patch_coverage(mask, (2, 3), 2)
    assert coverage.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.25]]
    with pytest.raises(ValueError, match=r"\[4, 6\] pixels"):
        patch_coverage(torch.zeros(4, 4), (2, 3), 2)


def test_even_attention_gets_the_area_share_and_attention_on_the_region_gets_all():
    coverage = torch.tensor([[1.0, 0.0], [0.5, 0.0]])
    even = torch.full((2, 2), 0.25)
    assert float(region_share(even, coverage)) == pytest.approx(float(coverage.mean()))
    on_region = torch.tensor([[[0.7, 0.0], [0.0, 0.0]], [[0.0, 0.3], [0.0, 0.7]]])  # [H = 2, 2, 2]
    assert region_share(on_region, coverage).tolist() == pytest.approx([1.0, 0.0])
    assert float(region_share(torch.tensor([0.2, 0.0, 0.2, 0.0]), coverage)) == pytest.approx(0.75)  # [G]
    with pytest.raises(ValueError, match="no weight"):
        region_share(torch.zeros(2, 2), coverage)
    with pytest.raises(ValueError, match="patch grid"):
        region_share(torch.ones(3), coverage)


def test_planted_high_norm_patches_are_named_with_place_norm_and_attention():
    generator = torch.Generator().manual_seed(0)
    norms = 40 + torch.rand(8, 8, generator=generator) * 10  # typical patches: 40 to 50
    norms[1, 6], norms[7, 0] = 400.0, 180.0  # two background outliers, as Darcet et al.'s
    attention = torch.full((8, 8), 0.2 / 62)
    attention[1, 6], attention[7, 0] = 0.5, 0.3  # they take most of the class token's attention
    found = find_artifact_tokens(norms, attention)
    assert [(token.row, token.column) for token in found] == [(1, 6), (7, 0)]
    median = float(norms.flatten().median())
    assert found[0].norm == pytest.approx(400.0) and found[0].norm_ratio == pytest.approx(400.0 / median)
    assert found[0].attention == pytest.approx(0.5) and found[0].attention_ratio == pytest.approx(32.0)
    assert find_artifact_tokens(norms, attention, norm_ratio=5.0)[0].row == 1  # only the larger one
    assert len(find_artifact_tokens(norms, attention, norm_ratio=5.0)) == 1
    assert find_artifact_tokens(norms)[1].attention is None


def test_no_patch_is_named_without_an_outlier_even_where_attention_piles_up():
    norms = torch.linspace(40, 70, 64).reshape(8, 8)  # the largest is 1.3 x the median
    attention = torch.zeros(8, 8)
    attention[3, 3] = 1.0  # high attention alone names nothing: an object draws it for a reason
    assert find_artifact_tokens(norms, attention) == []


def test_a_grid_of_one_patch_names_none():
    # regression: `inspect --image-size 5x5` makes a 1 x 1 grid and the detector refused it
    assert find_artifact_tokens(torch.full((1, 1), 3.0), torch.ones(1, 1)) == []


@pytest.mark.parametrize("arguments, message", [
    ((torch.ones(64),), r"\[gh, gw\]"),
    ((torch.ones(0, 4),), r"\[gh, gw\]"),
    ((torch.ones(8, 8), torch.ones(4, 4)), "same"),
    ((torch.ones(8, 8),), "above 1"),
    ((torch.zeros(8, 8),), "median"),
])
def test_bad_arguments_are_named(arguments, message):
    ratio = 1.0 if message == "above 1" else 2.0
    with pytest.raises(ValueError, match=message):
        find_artifact_tokens(*arguments, norm_ratio=ratio)
