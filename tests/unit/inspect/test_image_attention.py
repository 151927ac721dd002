"""Text -> patch attention over the image: the ink reference, the score, the PNG."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.inspect.compute.image_alignment import ink_patches, patch_alignment, patch_attention_map
from attnlab.inspect.draw.image_attention import plot_text_to_image_attention


def _image() -> torch.Tensor:
    image = torch.zeros(8, 8)
    image[0:2, 0:2] = 1.0  # patch 0 (2x2 patches)
    image[6, 7] = 0.5  # patch 15
    image[4, 4] = 0.1  # below the threshold: patch 10 stays empty
    return image


def test_ink_patches_marks_patches_with_any_inked_pixel():
    inked = ink_patches(_image(), patch_size=2)
    assert inked.shape == (16,)
    assert torch.nonzero(inked).flatten().tolist() == [0, 15]
    assert ink_patches(_image()[None].repeat(3, 1, 1), 4).shape == (3, 4)
    with pytest.raises(ValueError, match="patch_size"):
        ink_patches(_image(), 3)


def test_patch_alignment_is_attention_mass_on_ink_and_its_lift_over_uniform():
    reference = ink_patches(_image(), 2)[None]  # [1, 16]
    on_ink = torch.zeros(1, 2, 3, 16)
    on_ink[..., 0] = 1.0
    score = patch_alignment(on_ink, reference)
    assert score.mass == pytest.approx(1.0)
    assert score.chance == pytest.approx(2 / 16)
    assert score.lift == pytest.approx(8.0)
    uniform = torch.full((1, 2, 3, 16), 1 / 16)
    assert patch_alignment(uniform, reference).lift == pytest.approx(1.0)


def test_patch_alignment_counts_only_selected_tokens():
    reference = ink_patches(_image(), 2)[None]
    weights = torch.zeros(1, 1, 2, 16)
    weights[0, 0, 0, 0] = 1.0  # token 0 on ink
    weights[0, 0, 1, 5] = 1.0  # token 1 on background
    assert patch_alignment(weights, reference).mass == pytest.approx(0.5)
    only_first = torch.tensor([[True, False]])
    assert patch_alignment(weights, reference, only_first).mass == pytest.approx(1.0)


def test_patch_attention_map_spreads_each_patch_over_its_pixels():
    weights = torch.zeros(16)
    weights[1] = 1.0
    pixels = patch_attention_map(weights, grid_size=4, patch_size=2)
    assert pixels.shape == (8, 8)
    assert pixels[0:2, 2:4].sum() == 4 and pixels.sum() == 4


def test_plot_writes_a_png_per_head_and_mean(tmp_path):
    weights = torch.softmax(torch.randn(2, 3, 16), dim=-1)
    path = plot_text_to_image_attention(
        _image(), weights, ["[CLS]", "a", "seven"], tmp_path / "attention.png", patch_size=2,
        title="this is a seven", reference=ink_patches(_image(), 2),
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="tokens"):
        plot_text_to_image_attention(_image(), weights, ["a"], tmp_path / "x.png", patch_size=2)


def test_patch_alignment_agrees_with_the_inspection_statistics():
    from attnlab.inspect.compute.statistics import row_statistics

    generator = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(3, 2, 4, 16, generator=generator), dim=-1)
    reference = torch.rand(3, 16, generator=generator) > 0.6
    query_mask = torch.tensor([[True] * 4, [True] * 2 + [False] * 2, [True] * 3 + [False]])
    values, rows = row_statistics(weights, query_mask, torch.ones(3, 16, dtype=torch.bool),
                                  alignment=reference[:, None, :])
    expected = values["alignment_score"][rows["alignment_score"]].mean()
    assert patch_alignment(weights, reference, query_mask).mass == pytest.approx(float(expected), rel=1e-5)


def test_the_picture_has_a_colour_bar():
    # Regression: the panels had no colour bar, so their scale (each panel's own maximum) was unsaid.
    from attnlab.inspect.draw.image_attention import text_to_image_attention_figure

    weights = torch.softmax(torch.randn(2, 3, 16), dim=-1)
    figure = text_to_image_attention_figure(_image(), weights, ["[CLS]", "a", "seven"], patch_size=2)
    bars = [axis for axis in figure.axes if "largest" in axis.get_ylabel()]
    assert len(bars) == 1 and len(figure.axes) == 3 * (2 + 1) + 1  # tokens x (heads + mean), the bar
    overlays = [axis.images[1] for axis in figure.axes if len(axis.images) == 2]  # image, attention
    assert len(overlays) == 3 * 3 and all(overlay.get_clim() == (0, 1) for overlay in overlays)
    assert all(float(np.asarray(overlay.get_array()).max()) == pytest.approx(1.0) for overlay in overlays)
