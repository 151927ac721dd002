"""Inspection results display inline in a notebook: a small notebook run headlessly
(nbclient), and its HTML output opened in Chromium, offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

TEXTS = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 4
HOSTILE = "<script>window.__pwned = 1</script>"

CELLS = [
    """import attnlab
from attnlab.inspect.commands.explain_text import explain
from attnlab.inspect.commands.inspect_text import write_inspection
from attnlab.inspect.commands.compare_models import compare_models
model, tokenizer, _ = attnlab.load(MODEL)""",
    f"""explain(model, tokenizer, "a fine film {HOSTILE}", steps=4)""",
    """write_inspection(model, tokenizer, "great fun", "inspection", formats=["png"])""",
    """compare_models(model, tokenizer, model, tokenizer, [("a fine film", None), ("dull", None)], max_length=16)""",
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    root = tmp_path_factory.mktemp("notebook")
    tokenizer = Tokenizer(train_tokenizer(TEXTS + [HOSTILE], vocab_size=80, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(
        tokenizer.vocab_size, 16, 2, 2, 32, max_len=64, pad_id=tokenizer.pad_token_id
    )
    EncoderClassifier(encoder, 2, label_names=["neg", "pos"]).save_pretrained(
        root / "model", tokenizer=tokenizer
    )
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(f"MODEL = {str(root / 'model')!r}\n" + CELLS[0])]
    notebook.cells += [nbformat.v4.new_code_cell(cell) for cell in CELLS[1:]]
    source = str(Path(__file__).resolve().parents[3] / "src")
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [source] + ([before] if before else [])
    )  # the kernel's import path
    try:
        client = nbclient.NotebookClient(
            notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(root)}}
        )
        client.execute()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    return root, notebook


def _html(cell) -> str:
    return "".join(output.get("data", {}).get("text/html", "") for output in cell.outputs)


def test_every_result_has_an_html_view(executed):
    _, notebook = executed
    explanation, inspection, comparison = (_html(cell) for cell in notebook.cells[1:])
    assert 'class="attnlab-explanation"' in explanation and '"\\u003c"' in explanation  # the "<" token
    assert "<script>window.__pwned" not in explanation  # only inside escaped JSON
    assert inspection.startswith("<iframe srcdoc=") and "&lt;script" in inspection
    assert "B − A" in comparison


def test_the_outputs_render_offline_in_chromium(executed, chromium, open_page):
    root, notebook = executed
    page_path = root / "outputs.html"
    page_path.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        + "".join(f'<div class="cell">{_html(cell)}</div>' for cell in notebook.cells[1:])
        + "</body></html>",
        encoding="utf-8",
    )
    page, problems, requests = open_page(chromium, page_path)
    page.wait_for_selector(".method", timeout=10_000)
    assert page.locator(".attnlab-explanation .method").count() == 6
    shown = page.locator('[data-method="raw"] .tok').all_text_contents()
    assert "<" in shown and shown[0] == "[CLS]"  # markup characters shown as text
    frame = page.frames[1]
    frame.wait_for_selector("body[data-ready=true]", timeout=10_000)
    assert page.evaluate("window.__pwned === undefined")
    assert not problems, problems
    assert all(url.startswith(("file:", "data:", "about:")) for url in requests), requests
    page.close()
