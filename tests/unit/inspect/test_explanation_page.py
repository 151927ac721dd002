"""The explanation page and picture: methods side by side, token text as text, offline."""

from __future__ import annotations

import re

import pytest

from attnlab.inspect.draw.explanation import (
    explanation_fragment,
    normalized_scores,
    plot_explanation,
    render_explanation,
)

TOKENS = [
    "[CLS]",
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 2">',
    "&amp;",
    "fun",
]
SCORES = {"raw": [0.1, 0.2, 0.3, 0.2, 0.2], "integrated-gradients": [0.0, -2.0, 1.0, 0.5, 0.0]}


def test_each_method_is_shown_on_its_own_scale():
    assert normalized_scores([0.0, -2.0, 1.0]) == [0.0, -1.0, 0.5]  # signed: over the largest |score|
    assert normalized_scores([1.0, 1.5, 3.0]) == [pytest.approx(1 / 3), 0.5, 1.0]  # never negative: 0 stays 0
    # a nearly flat row stays nearly flat (it was stretched to 0..1, as contrasted as a sharp one)
    assert min(normalized_scores([0.140, 0.143, 0.146])) > 0.95
    assert normalized_scores([0.0, 0.0]) == [0.0, 0.0]


def test_picture_has_a_row_per_method_with_the_range_its_colours_stand_for():
    # Regression: each row was rescaled under an unlabelled -1..1 bar.
    figure = plot_explanation(TOKENS, SCORES)
    labels = [label.get_text() for label in figure.axes[0].get_yticklabels()]
    assert labels == ["raw\n0.1..0.3", "integrated-gradients\n±2"]
    assert "row's scale" in figure.axes[1].get_ylabel()
    long = plot_explanation(["tok"] * 100, {"raw": [1.0] * 100}, title="t", max_tokens=80)
    assert long.axes[0].get_title() == "t (first 80 of 100 tokens)"


def test_fragments_do_not_share_ids():
    one, two = explanation_fragment(TOKENS, SCORES), explanation_fragment(TOKENS, SCORES)
    assert set(re.findall(r'id="([^"]+)"', one)).isdisjoint(re.findall(r'id="([^"]+)"', two))


def test_page_shows_every_method_in_chromium(chromium, open_page, tmp_path):
    path = tmp_path / "explanation.html"
    path.write_text(render_explanation(TOKENS, SCORES, meta={"text": "<b>x</b>"}), encoding="utf-8")
    page, problems, requests = open_page(chromium, path)
    boxes = page.locator(".method")
    assert boxes.count() == 2
    assert page.locator('[data-method="integrated-gradients"] .tok').all_text_contents() == TOKENS
    assert page.evaluate("window.__pwned === undefined")
    assert not problems and all(url.startswith(("file:", "data:")) for url in requests)
    page.close()
