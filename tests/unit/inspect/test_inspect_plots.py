"""Heatmaps: files written headless, long inputs pooled, labels kept as text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.inspect.draw.plots import (
    bucket_attention,
    plot_head,
    plot_layer,
    plot_model,
    plot_statistic,
    save_figure,
    time_ticks,
)


def test_bucketing_keeps_row_mass_and_names_ranges():
    weights = torch.softmax(torch.randn(600, 600), -1)
    tokens = [f"t{i}" for i in range(600)]
    matrix, rows, columns = bucket_attention(weights, tokens, max_tokens=128)
    assert matrix.shape == (128, 128)  # 600 positions in buckets of 4 or 5
    assert np.allclose(matrix.sum(-1), 1.0, atol=1e-4)
    assert rows[0] == "0-3" and columns[-1] == "595-599"
    sizes = [int(b) - int(a) + 1 for a, b in (label.split("-") for label in rows)]
    assert set(sizes) == {4, 5} and sum(sizes) == 600


def test_window_then_small_map_keeps_tokens():
    weights = np.eye(10)
    tokens = [str(i) for i in range(10)]
    matrix, rows, columns = bucket_attention(weights, tokens, window=(2, 6))
    assert matrix.shape == (4, 4) and rows == ["2", "3", "4", "5"] == columns
    with pytest.raises(ValueError, match="window"):
        bucket_attention(weights, tokens, window=(5, 5))
    with pytest.raises(ValueError, match="tokens"):
        bucket_attention(weights, tokens[:3])


def test_pictures_are_written_as_png_and_svg(tmp_path):
    tokens = ["[CLS]", "$x$", "<script>", "a_b", "&", "[SEP]"]
    layer = torch.softmax(torch.randn(4, 6, 6), -1)
    written = save_figure(plot_head(layer[0], tokens, title="cost $5"), tmp_path / "head", ("png", "svg"))
    written += save_figure(plot_layer(layer, tokens, title="layer_1"), tmp_path / "layer", ("png", "svg"))
    written += save_figure(plot_model({"layer_1": layer, "layer_2": layer}), tmp_path / "model", ("png",))
    written += save_figure(plot_statistic(np.random.rand(2, 4), "entropy"), tmp_path / "entropy", ("svg",))
    for path in written:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") if path.suffix == ".png" else b"<svg" in data[:2000]
    svg = (tmp_path / "head.svg").read_text()
    assert "&lt;script&gt;" in svg and "<script>" not in svg  # SVG text is escaped
    with pytest.raises(ValueError, match="formats"):
        save_figure(plot_statistic(np.ones((1, 1)), "x"), tmp_path / "x", ("gif",))


def test_long_input_model_view_is_pooled():
    long = {f"layer_{l}": torch.softmax(torch.randn(2, 700, 700), -1) for l in (1, 2)}
    figure = plot_model(long, tile_tokens=32)
    image = figure.axes[0].images[0].get_array()
    assert image.shape[0] < 2 * 40 and image.shape[1] < 2 * 40  # two tiles of at most 32 + gaps


def test_statistic_colours_start_at_zero_and_cells_tell_close_values_apart():
    # Regression: 3.278..3.290 was stretched over the whole colour map (and printed 3.28 / 3.29).
    values = np.array([[3.278, 3.290], [3.281, 3.284]])
    figure = plot_statistic(values, "entropy")
    image = figure.axes[0].images[0]
    assert image.get_clim() == pytest.approx((0.0, 3.290))
    assert {text.get_text() for text in figure.axes[0].texts} == {"3.278", "3.290", "3.281", "3.284"}
    shares = plot_statistic(np.array([[0.2, 0.3]]), "normalized_entropy").axes[0].images[0]
    assert shares.get_clim() == (0.0, 1.0)
    signed = plot_statistic(np.array([[-0.5, 2.0]]), "difference").axes[0].images[0]
    assert signed.get_clim() == pytest.approx((-0.5, 2.0))


def _local_band(length: int, width: int) -> torch.Tensor:
    """Each query spreads its attention evenly over the keys within ``width`` of it."""
    positions = torch.arange(length)
    band = (positions[:, None] - positions[None, :]).abs() <= width
    return band.float() / band.sum(-1, keepdim=True)  # [T, T]


def test_a_long_map_shows_its_structure_on_a_labelled_scale():
    # Regression: a 500-token map was one dark block: weights near 1/17 on a fixed 0..1 scale.
    weights = _local_band(500, 8)
    figure = plot_head(weights, [f"t{i}" for i in range(500)])
    ax, bar = figure.axes
    image = ax.images[0]
    shown = np.asarray(image.get_array())
    low, high = image.get_clim()
    assert low == 0.0 and high == pytest.approx(float(shown.max()))
    brightness = np.asarray(image.norm(shown))
    diagonal = np.arange(shown.shape[0])
    assert brightness[diagonal, diagonal].min() > 0.35  # the band is bright (0.19 on a 0..1 scale)
    assert np.median(brightness) < 0.05  # and the rest dark
    assert "attention" in bar.get_ylabel()
    assert len(ax.get_xticks()) <= 48 and len(ax.get_yticks()) <= 48  # pooled labels, thinned

    # one layer: one scale for every head, so a faint head stays faint beside a sharp one
    layer = torch.stack([weights, torch.full((500, 500), 1 / 500)])
    layer_figure = plot_layer(layer, [f"t{i}" for i in range(500)])
    scales = {image.get_clim() for ax in layer_figure.axes for image in ax.images}
    assert len(scales) == 1 and next(iter(scales))[1] == pytest.approx(
        float(bucket_attention(weights, [""] * 500, max_tokens=64)[0].max()))


def test_the_model_view_has_a_colour_bar():
    # Regression: model.png had no colour bar (its tiles are each scaled to their own maximum).
    layer = torch.softmax(torch.randn(2, 6, 6), -1)
    figure = plot_model({"layer_1": layer, "layer_2": layer})
    assert len(figure.axes) == 2 and "largest weight" in figure.axes[1].get_ylabel()


def test_time_ticks_fall_at_round_seconds_among_pooled_columns():
    # 256 positions of 20 ms (5.12 s) pooled into 64 columns of 4: 1 s is position 50, inside column 12
    x, labels = time_ticks(256, 64, 0.02, most=6)
    assert labels == ["0 s", "1 s", "2 s", "3 s", "4 s", "5 s"]
    assert x[0] == pytest.approx(-0.5) and x[1] == pytest.approx(12.0)
    x, labels = time_ticks(25, 25, 0.02)  # 0.5 s unpooled: one column a position
    assert labels == ["0.0 s", "0.1 s", "0.2 s", "0.3 s", "0.4 s", "0.5 s"] and x[-1] == pytest.approx(24.5)
    _, labels = time_ticks(10, 10, 0.02, first=100)  # a window from 2.00 s to 2.20 s
    assert labels[0] == "2.00 s" and labels[-1] == "2.20 s"
    with pytest.raises(ValueError, match="seconds_per_position"):
        time_ticks(10, 10, 0.0)


def test_a_key_axis_in_seconds_is_ticked_in_seconds_and_text_keys_keep_their_ranges():
    # Regression: a speech clip's cross-attention PNG showed pooled position ranges ("0-3", "12-15")
    weights = torch.softmax(torch.randn(2, 5, 256), -1)  # [H, T, S]
    queries, times = [f"w{i}" for i in range(5)], [f"{i * 0.02:.2f}s" for i in range(256)]
    figure = plot_layer(weights, queries, key_tokens=times, key_seconds=0.02)
    bottom = [ax for ax in figure.axes if ax.images and ax.get_xticklabels()]
    assert bottom and all([label.get_text() for label in ax.get_xticklabels()]
                          == ["0 s", "1 s", "2 s", "3 s", "4 s", "5 s"] for ax in bottom)
    assert all(ax.get_xlabel() == "time (s)" for ax in bottom)
    head = plot_head(weights[0], queries, key_tokens=times, key_seconds=0.02).axes[0]
    assert head.get_xlabel() == "time (s)" and head.get_xticklabels()[1].get_text() == "0.5 s"
    text = plot_layer(weights, queries, key_tokens=times)  # no time axis: position ranges as before
    assert text.axes[-2].get_xticklabels()[0].get_text() == "0-3" and text.axes[-2].get_xlabel() == ""
