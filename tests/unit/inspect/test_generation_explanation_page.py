"""The page of generated-token attributions: escaping, shape checks, stepping in headless Chromium."""

from __future__ import annotations


import pytest

from attnlab.inspect.commands.explain_generation import GenerationExplanation
from attnlab.inspect.draw.generation_explanation import plot_generation_attribution, render_generation_explanation

TOKENS = ["<s>", "<script>window.__pwned = 1</script>", " the", "&amp;", " cat", "</script>", " sat"]
P = 4


def _scores():
    G, N = len(TOKENS) - P, len(TOKENS)
    rows = [[(s + 1) / 10 if s < P + g else 0.0 for s in range(N)] for g in range(G)]
    signed = [[(-1) ** s * v for s, v in enumerate(row)] for row in rows]
    return {"raw": rows, "occlusion": signed}


def _lens():
    layers = ["embeddings", "layer_1"]
    return {"layers": layers, "top": [[[{"token": "</script><b>", "probability": 0.5}]] * 3] * 2,
            "rank": [[3, 2, 1]] * 2, "probability": [[0.1, 0.2, 0.3]] * 2}


def _page():
    return render_generation_explanation(TOKENS, P, _scores(), objective=[-1.0, -2.0, -0.5], lens=_lens(),
                                         meta={"prompt": "<b>x</b>"})


def test_token_text_never_reaches_the_page_as_markup():
    page = _page()
    assert "<script>window" not in page and "<b>x</b>" not in page and "</script><b>" not in page


def test_wrong_shapes_are_refused():
    bad = _scores()
    bad["raw"] = bad["raw"][:2]
    with pytest.raises(ValueError, match="raw must hold 3 rows of 7 scores"):
        render_generation_explanation(TOKENS, P, bad, objective=[0, 0, 0])


def test_the_picture_has_a_panel_per_method():
    figure = plot_generation_attribution(TOKENS, P, _scores())
    panels = [axes for axes in figure.axes if axes.get_title(loc="left")]
    assert [axes.get_title(loc="left") for axes in panels] == ["raw", "occlusion"]
    assert len(panels[0].get_yticklabels()) == 3  # one row per generated token


def test_notebooks_get_the_page_in_a_frame():
    explanation = GenerationExplanation("p", TOKENS, list(range(7)), P, _scores(), [-1.0, -2.0, -0.5])
    fragment = explanation._repr_html_()
    assert fragment.startswith("<iframe srcdoc=") and "<script>window" not in fragment


def test_stepping_through_the_generated_tokens(browser, open_page, tmp_path):
    path = tmp_path / "explanation.html"
    path.write_text(_page(), encoding="utf-8")
    page, problems, requests = open_page(browser, path)
    page.wait_for_selector("body[data-ready=true]", timeout=10_000)
    assert problems == [] and [url for url in requests if not url.startswith("file://")] == []
    assert page.evaluate("window.__pwned") is None
    boxes = page.eval_on_selector_all(".method", "boxes => boxes.map(b => b.dataset.method)")
    assert boxes == ["raw", "occlusion"]
    tokens = page.eval_on_selector_all(".method[data-method=raw] .tok", "s => s.map(x => x.textContent)")
    assert tokens == [t.replace(" ", "\u00b7") for t in TOKENS[: P + 1]]  # the prompt, then the explained token
    assert page.inner_text("#step-label").startswith("token 1 of 3")
    assert page.locator("#lens tr").count() == 3 and "</script><b>" in page.inner_text("#lens")
    page.click("#next")
    assert page.inner_text("#step-label").startswith("token 2 of 3")
    assert page.locator(".method[data-method=raw] .tok").count() == P + 2
    assert page.locator(".method[data-method=raw] .tok.generated").count() == 1  # " cat", generated before
    assert page.inner_text(".method[data-method=raw] .tok.target") == "</script>"  # the explained token
    page.screenshot(path=str(tmp_path / "page.png"))
    page.close()


def test_the_lens_picture_shows_whitespace_tokens():
    from attnlab.inspect.draw.logit_lens import plot_logit_lens

    figure = plot_logit_lens([[0.1, 0.9], [0.5, 0.2]], [["\n", " the"], ["a", "b"]], ["embeddings", "layer_1"],
                             ["' Paris'", "'.'"])
    texts = {text.get_text() for text in figure.axes[0].texts}
    assert {"\u21b5", "\u00b7the", "a", "b"} <= texts
