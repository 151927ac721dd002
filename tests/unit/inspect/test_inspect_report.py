"""The interactive report: escaping, self-containment, and behaviour in headless Chromium."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnlab.inspect.draw.report import json_for_script, render_report, render_summary, write_report
from attnlab.inspect.compute.rollout import attention_rollout

HOSTILE = [
    "[CLS]",
    "<script>window.__pwned = 1</script>",
    "</script><script>window.__pwned = 2</script>",
    '<img src=x onerror="window.__pwned = 3">',
    "&amp;",
    "<!--",
    "movie",
    "[SEP]",
]


def _attentions(tokens, layers=2, heads=3, seed=0):
    torch.manual_seed(seed)
    T = len(tokens)
    return {f"layer_{l + 1}": torch.softmax(3 * torch.randn(heads, T, T), -1) for l in range(layers)}


def test_json_for_script_cannot_close_the_script():
    text = json_for_script({"token": "</script><!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"token": "</script><!-- & \u2028"}


def test_tokens_never_reach_the_page_as_markup():
    page = render_report(
        _attentions(HOSTILE),
        HOSTILE,
        meta={"text": "<b>bold</b>"},
        statistics={"entropy": [[1.0, 2.0, None]] * 2},
    )
    assert "window.__pwned" in page  # present, but only inside the escaped JSON
    assert "<script>window.__pwned" not in page and "<img" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert len(re.findall(r"<script\b", page)) == 2  # the data block and the page script
    assert not re.search(r"\bsrc=\"http|href=\"http|<link[^>]+stylesheet", page)  # nothing fetched


def test_summary_page_inlines_its_images(tmp_path):
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    page = render_summary(
        {"entropy": [[0.5, None]]}, ["layer_1"], meta={"data": "<x>"}, images={"entropy <1>": png}
    )
    assert "data:image/png;base64," in page and "&lt;x&gt;" in page and "entropy &lt;1&gt;" in page


def test_long_inputs_are_pooled_in_the_report():
    tokens = [f"w{i}" for i in range(300)]
    page = render_report(_attentions(tokens, layers=1, heads=1), tokens, max_tokens=100)
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', page, re.S).group(1))
    assert len(data["tokens"]) == 100 and data["tokens"][0] == "0-2 w0 w1 w2"


@pytest.fixture
def opened(browser, open_page, tmp_path):
    """Open a fresh report; returns (page, attentions, rollout, problems, requests)."""
    tokens = HOSTILE
    attentions = _attentions(tokens)
    rollout = attention_rollout({n: w[None] for n, w in attentions.items()})[:, 0]
    path = write_report(
        tmp_path / "report.html",
        attentions,
        tokens,
        statistics={"entropy": [[1.0, 2.0, 3.0]] * 2},
        rollout=rollout,
    )
    page, problems, requests = open_page(browser, path)
    page.wait_for_selector("body[data-ready=true]", timeout=10_000)
    yield page, attentions, rollout, problems, requests
    page.close()


def _cell_colours(page, row):
    return page.eval_on_selector_all(
        f"#heatmap tbody tr[data-row='{row}'] td", "cells => cells.map(c => c.style.background)"
    )


def test_page_loads_without_errors_or_network(opened):
    page, _, _, problems, requests = opened
    assert problems == []
    assert [url for url in requests if not url.startswith("file://")] == []
    assert page.evaluate("window.__pwned") is None
    assert page.inner_text("#heatmap").count("[CLS]") == 2  # row and column label


def test_tokens_render_as_text(opened):
    page = opened[0]
    texts = page.eval_on_selector_all("#tokens .token", "spans => spans.map(s => s.textContent)")
    assert texts == HOSTILE
    assert page.locator("#tokens img").count() == 0 and page.locator("#tokens script").count() == 0


def test_clicking_a_head_changes_the_view(opened):
    page = opened[0]
    assert page.get_attribute("#heatmap", "data-head") == "0"
    before = _cell_colours(page, 1)
    page.click("#head-buttons button[data-head='2']")
    assert page.get_attribute("#heatmap", "data-head") == "2"
    assert page.get_attribute("#head-buttons button[data-head='2']", "class") == "selected"
    assert _cell_colours(page, 1) != before
    page.click("#layer-buttons button[data-layer='1']")
    assert page.get_attribute("#heatmap", "data-layer") == "1"
    page.click("#grid canvas[data-layer='0'][data-head='1']")  # the model grid selects too
    assert (page.get_attribute("#heatmap", "data-layer"), page.get_attribute("#heatmap", "data-head")) == (
        "0",
        "1",
    )
    page.click("#head-buttons button[data-head='rollout']")
    assert page.get_attribute("#heatmap", "data-head") == "rollout"


def test_hovering_a_token_highlights_its_row(opened):
    page, attentions, _, problems, _ = opened
    page.click("#layer-buttons button[data-layer='1']")
    page.click("#head-buttons button[data-head='2']")
    page.hover("#tokens .token[data-index='6']")
    highlighted = page.eval_on_selector_all(
        "#heatmap tbody tr.highlight", "rows => rows.map(r => r.dataset.row)"
    )
    assert highlighted == ["6"]
    assert page.get_attribute("#heatmap", "data-row") == "6"
    expected = attentions["layer_2"][2]  # [T, T]
    to = page.eval_on_selector_all("#attends-to .token", "s => s.map(x => Number(x.dataset.weight))")
    by = page.eval_on_selector_all("#attended-by .token", "s => s.map(x => Number(x.dataset.weight))")
    assert to == pytest.approx(expected[6].tolist(), abs=1e-3)
    assert by == pytest.approx(expected[:, 6].tolist(), abs=1e-3)
    assert "[6] movie" in page.inner_text("#hover-info")
    page.hover("#tokens .token[data-index='2']")
    assert page.eval_on_selector_all(
        "#heatmap tbody tr.highlight", "rows => rows.map(r => r.dataset.row)"
    ) == ["2"]
    assert problems == []


def test_a_models_layer_attentions_go_straight_into_the_report_and_rollout():
    from attnlab import TransformerEncoder
    from attnlab.inspect import attention_rollout
    from attnlab.outputs import LayerAttentions

    model = TransformerEncoder(20, 16, 2, 2, 32, pad_id=0).eval()
    out = model(torch.tensor([[3, 4, 5, 6]]), output_attentions=True)
    one_example = LayerAttentions(weights[0] for weights in out.attentions)  # [H, T, T] per layer
    page = render_report(one_example, ["a", "b", "c", "d"])
    assert "layer_2" in page
    assert attention_rollout(out.attentions).shape == (2, 1, 4, 4)


def test_difference_tables_shade_by_size_and_plain_tables_from_zero():
    # Regression: B - A tables were shaded by signed value, so the largest change (-0.9) was palest.
    import re

    from attnlab.inspect.draw.report import stats_tables_html

    def shades(page):
        return [(colour, float(alpha)) for colour, alpha in re.findall(r"rgba\(([\d,]+),([\d.]+)\)", page)]

    signed = shades(stats_tables_html({"difference": [[-0.9, 0.1, 0.3]]}, ["layer_1"], signed=True))
    assert signed[0] == ("178,24,43", 0.58) and signed[0][1] > signed[2][1] > signed[1][1]
    assert signed[1][0] == signed[2][0] == "33,102,172"
    plain = shades(stats_tables_html({"entropy": [[3.278, 3.290]]}, ["layer_1"]))
    assert abs(plain[0][1] - plain[1][1]) < 0.01  # near-equal values look near-equal
