"""generation.html: escaping, shape checks, and stepping through a generation in headless Chromium."""

from __future__ import annotations


import pytest
import torch

from attnlab.inspect.draw.generation_report import render_generation_report, write_generation_report

TOKENS = ["<s>", "<script>window.__pwned = 1</script>", "the", "&amp;", " cat", " sat", "</script>", " down"]
PROMPT = 4


def _rows(layers=2, heads=3):
    torch.manual_seed(0)
    N = len(TOKENS)
    rows = torch.zeros(N - PROMPT, layers, heads, N)
    for step in range(N - PROMPT):
        rows[step, ..., : PROMPT + step + 1] = torch.softmax(torch.randn(layers, heads, PROMPT + step + 1), -1)
    return rows


def test_tokens_never_reach_the_page_as_markup():
    page = render_generation_report(_rows(), TOKENS, PROMPT)
    assert "<script>window" not in page and "</script><" not in page.split("attnlab-data")[1][:2000]


def test_wrong_shapes_are_refused():
    with pytest.raises(ValueError, match=r"rows must be \[G, L, H, N\]"):
        render_generation_report(_rows()[:, :, :, :-1], TOKENS, PROMPT)


def test_stepping_through_the_generation(browser, open_page, tmp_path):
    path = write_generation_report(tmp_path / "generation.html", _rows(), TOKENS, PROMPT)
    page, problems, requests = open_page(browser, path)
    page.wait_for_selector("body[data-ready=true]", timeout=10_000)
    assert problems == [] and [url for url in requests if not url.startswith("file://")] == []
    assert page.evaluate("window.__pwned") is None
    texts = page.eval_on_selector_all("#text .token", "spans => spans.map(s => s.textContent)")
    assert texts == TOKENS
    assert page.inner_text("#step-label").endswith(TOKENS[PROMPT].replace(" ", "\u00b7"))
    visible = page.eval_on_selector_all("#text .token", "spans => spans.filter(s => !s.hidden).length")
    assert visible == PROMPT + 1
    page.click("#next")
    assert page.inner_text("#step-label").startswith("generated token 2 of 4")
    assert page.eval_on_selector_all("#text .token", "spans => spans.filter(s => !s.hidden).length") == PROMPT + 2
    page.click("#layers-heads td[data-layer='0'][data-head='2']")
    assert page.inner_text("#view-title") == "Layer 1, head 3"
    assert page.locator("#layers-heads td.selected").count() == 1
    page.close()
