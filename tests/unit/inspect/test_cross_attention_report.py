"""The report page on maps whose queries and keys are two sequences (target x source)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from attnlab.inspect.draw.report import render_report, write_report

TARGET = ["der", "<b>Hund</b>", "bellt", "</s>"]
SOURCE = ["the", "dog", "barks", "loudly", "."]


def _cross(layers=2, heads=3, seed=0):
    torch.manual_seed(seed)
    return {f"cross.layer_{l + 1}": torch.softmax(3 * torch.randn(heads, len(TARGET), len(SOURCE)), -1)
            for l in range(layers)}


def _data(page: str) -> dict:
    return json.loads(re.search(r'type="application/json">(.*?)</script>', page, re.S).group(1))


def test_a_non_square_map_carries_both_token_lists_and_names_its_sides():
    page = render_report(_cross(), TARGET, key_tokens=SOURCE, sides=("target", "source"))
    data = _data(page)
    assert data["tokens"] == TARGET and data["key_tokens"] == SOURCE and data["sides"] == ["target", "source"]
    assert "rows: target, columns: source" in page
    assert "<b>Hund" not in page  # the token travels escaped


def test_a_non_square_map_is_refused_without_key_tokens_and_with_the_wrong_lengths():
    with pytest.raises(ValueError, match=r"self-attention \[H, T, T\]"):
        render_report(_cross(), TARGET)
    with pytest.raises(ValueError, match="S = 4 source"):
        render_report(_cross(), TARGET, key_tokens=SOURCE[:4], sides=("target", "source"))


def test_long_sides_are_pooled_apart():
    torch.manual_seed(0)
    weights = {"cross.layer_1": torch.softmax(torch.randn(1, 30, 300), -1)}
    source = [f"s{i}" for i in range(300)]
    data = _data(render_report(weights, [f"t{i}" for i in range(30)], key_tokens=source, max_tokens=100))
    assert len(data["tokens"]) == 30 and len(data["key_tokens"]) == 100


def test_hovering_a_target_token_shows_its_row_and_a_source_token_its_column(browser, open_page, tmp_path):
    attentions = _cross()
    path = write_report(tmp_path / "report.html", attentions, TARGET, key_tokens=SOURCE, sides=("target", "source"))
    page, problems, _ = open_page(browser, path)
    page.wait_for_selector("body[data-ready=true]", timeout=10_000)
    page.click("#layer-buttons button[data-layer='1']")
    page.click("#head-buttons button[data-head='2']")
    expected = attentions["cross.layer_2"][2]  # [T, S]
    assert page.locator("#heatmap tbody tr").count() == len(TARGET)
    assert page.locator("#heatmap thead th").count() == len(SOURCE) + 1
    page.hover("#tokens .token[data-index='1']")
    to = page.eval_on_selector_all("#attends-to .token", "s => s.map(x => Number(x.dataset.weight))")
    assert to == pytest.approx(expected[1].tolist(), abs=1e-3)
    assert "target [1] <b>Hund</b>" in page.inner_text("#hover-info")
    page.hover("#attended-by .token[data-index='3']")
    by = page.eval_on_selector_all("#tokens .token", "s => s.map(x => Number(x.dataset.weight))")
    assert by == pytest.approx(expected[:, 3].tolist(), abs=1e-3)
    assert "source [3] loudly" in page.inner_text("#hover-info")
    sizes = page.eval_on_selector_all("#grid canvas", "c => c.map(x => [x.width, x.height])")
    assert sizes == [[len(SOURCE), len(TARGET)]] * 6
    assert page.inner_text("#heatmap thead th.corner") == "target \\ source"
    assert problems == []
    page.close()
