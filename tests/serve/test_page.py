"""The explorer as a person uses it, in headless Chromium: type, click a head, switch it off,
see the prediction change by what the library's head mask computes; step and explain."""

from __future__ import annotations

import torch

from attnlab.inspect.compute.heads import mask_heads

TEXT = "the cat sat on the mat . the cat sat on the"


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    problems, requests = [], []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(url)
    return page, problems, requests


def test_type_click_a_head_switch_it_off_and_see_the_prediction_change(chromium, decoder_server, tmp_path) -> None:
    server, session = decoder_server
    page, problems, requests = _open(chromium, server.url)
    page.fill("#text", TEXT)
    page.click("#run")
    page.wait_for_selector("#tokens .token")
    assert page.locator("#tokens .token").count() == 12
    assert page.locator("#head-grid .cell").count() == 8

    page.click('#head-grid .cell[data-head="1:2"]')  # a click shows the head's map
    page.wait_for_selector("#map-title:has-text('layer 1, head 2')")  # selectors: the page's CSP forbids eval
    assert page.locator("#map").evaluate("c => c.width") == 12 * 24

    page.click('#head-grid .cell[data-head="2:1"]', modifiers=["Shift"])  # shift-click switches it off
    page.wait_for_selector('#head-grid .cell.off[data-head="2:1"]')
    page.wait_for_selector("#prediction td.up, #prediction td.down")
    model, tokenizer = session.explorer.model, session.explorer.tokenizer
    ids = torch.tensor([tokenizer.encode(TEXT).ids])
    with torch.no_grad(), mask_heads(model, {"layer_2": [0]}):
        expected = torch.softmax(model(ids).logits[0, -1], -1)
    shown = page.locator("#prediction tr[data-id]").evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.id), Number(r.children[2].textContent)])")
    assert shown
    for token, probability in shown:
        assert abs(probability - float(expected[token])) < 1e-3  # shown with three decimals
    page.screenshot(path=str(tmp_path / "switched-off.png"), full_page=True)

    page.click("#next-token")
    page.wait_for_selector("#generated .new")
    page.wait_for_selector("#attended .token")
    page.click("#explain")
    page.wait_for_selector("#explanation .token")
    assert "AOPC" in page.text_content("#faithfulness")
    page.screenshot(path=str(tmp_path / "explorer.png"), full_page=True)

    page.click("#all-on")
    page.wait_for_selector("#off-list:empty", state="attached")
    assert page.locator("#head-grid .cell.off").count() == 0
    assert problems == []
    assert all(url.startswith(server.url) for url in requests)  # nothing fetched from elsewhere
    page.close()


def test_a_refused_text_shows_its_error_on_the_page(chromium, decoder_server) -> None:
    server, _ = decoder_server
    page, problems, _ = _open(chromium, server.url)
    page.wait_for_selector("#tokens .token")
    page.fill("#text", "cat " * 100)
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    assert "at most 64" in page.text_content("#error")
    page.close()
