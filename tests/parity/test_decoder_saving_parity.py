"""Decoders written back by ``save_pretrained``: ``transformers`` opens the HuggingFace layout
and computes attnlab's logits (within 1e-5, float32); attnlab's layout reopens the same model.

Tiny random GPT-2, Llama, Mistral and Qwen2 models (tied and untied LM heads) are made by
``transformers`` at test time, opened with ``attnlab.load`` and written back.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import attnlab
from attnlab.models.decoder import DecoderForCausalLM
from attnlab.checkpoints.decoders.loading import decoder_config_from_hf

transformers = pytest.importorskip(
    "transformers", reason="parity with HuggingFace needs transformers (pip install -e '.[dev]')"
)

TOLERANCE = 1e-5
VOCAB = 61
COMMON = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
LLAMA_SIZES = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=64)
GPT2_SIZES = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64)

CASES = {
    "gpt2-tied": lambda: transformers.GPT2Config(**COMMON, **GPT2_SIZES),
    "gpt2-untied": lambda: transformers.GPT2Config(**COMMON, **GPT2_SIZES, tie_word_embeddings=False,
                                                   activation_function="gelu"),
    "llama-untied": lambda: transformers.LlamaConfig(**COMMON, **LLAMA_SIZES, attention_bias=True,
                                                     rope_theta=500.0, tie_word_embeddings=False),
    "llama-tied-llama3-rope": lambda: transformers.LlamaConfig(
        **COMMON, **LLAMA_SIZES, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "mistral": lambda: transformers.MistralConfig(**COMMON, **LLAMA_SIZES, sliding_window=5, head_dim=16),
    "qwen2-tied": lambda: transformers.Qwen2Config(**COMMON, **LLAMA_SIZES, tie_word_embeddings=True),
}


def _ids():
    torch.manual_seed(1)
    return torch.randint(3, VOCAB, (2, 9))


@pytest.fixture(scope="module", params=sorted(CASES))
def source(request, tmp_path_factory):
    """``(name, directory)``: a tiny random HuggingFace model, norms randomised too."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(CASES[request.param]())
    with torch.no_grad():
        for module in hf.modules():
            if hasattr(module, "weight") and module.weight is not None and module.weight.dim() == 1:
                module.weight.uniform_(0.5, 1.5)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    return request.param, directory


def _hf_logits(directory, ids):
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                                 output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with torch.no_grad():
        return hf.eval()(ids).logits


def _config(directory):
    return json.loads((directory / "config.json").read_text(encoding="utf-8"))


def test_huggingface_layout_opens_in_transformers_with_attnlabs_logits_and_the_config_kept(source, tmp_path):
    name, directory = source
    model = attnlab.load(directory).model
    written = model.save_pretrained(tmp_path / "hf", layout="huggingface")
    ids = _ids()
    with torch.no_grad():
        ours = model(ids).logits
    torch.testing.assert_close(_hf_logits(written, ids), ours, atol=TOLERANCE, rtol=0)
    assert _config(written) == _config(directory)  # every key kept
    with safe_open(str(written / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    assert ("lm_head.weight" in names) == (not model.config.tie_embeddings)
    if not name.startswith("gpt2"):
        assert {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"} <= names
        assert ("model.layers.1.self_attn.q_proj.bias" in names) == model.config.qkv_bias
    reopened = DecoderForCausalLM.from_pretrained(written)
    with torch.no_grad():
        assert torch.equal(reopened(ids).logits, ours)


def test_attnlab_layout_round_trip_gives_the_same_model_and_keeps_the_hf_config(source, tmp_path):
    _, directory = source
    model = attnlab.load(directory).model
    model.save_pretrained(tmp_path / "ours")
    again = attnlab.load(tmp_path / "ours").model
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
    generated = model.generate(ids, max_new_tokens=5).sequences
    assert torch.equal(again.generate(ids, max_new_tokens=5).sequences, generated)
    again.save_pretrained(tmp_path / "hf", layout="huggingface")
    assert _config(tmp_path / "hf") == _config(directory)


def test_a_decoder_without_its_hf_config_gets_one_built_from_its_own(source, tmp_path):
    _, directory = source
    model = attnlab.load(directory).model
    model.checkpoint_config = None  # as a GGUF model or one built from a DecoderConfig
    written = model.save_pretrained(tmp_path / "built", layout="huggingface")
    values = _config(written)
    assert values["model_type"] == _config(directory)["model_type"]
    assert decoder_config_from_hf(values) == model.config
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(written, _ids()), model(_ids()).logits, atol=TOLERANCE, rtol=0)


def test_a_changed_setting_is_written_and_every_other_key_kept(tmp_path):
    config = transformers.LlamaConfig(**{**COMMON, "eos_token_id": [2, 5]}, **LLAMA_SIZES)
    config.my_note = "kept"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "src")
    model = attnlab.load(tmp_path / "src").model
    model.config.max_len = 128  # longer context; the rotary table grows as needed
    written = model.save_pretrained(tmp_path / "hf", layout="huggingface")
    before, after = _config(tmp_path / "src"), _config(written)
    assert after["max_position_embeddings"] == 128 and after["eos_token_id"] == [2, 5]
    assert after["my_note"] == "kept" and set(before) <= set(after)
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(written, _ids()), model(_ids()).logits, atol=TOLERANCE, rtol=0)


def test_a_gguf_decoder_exports_to_the_llama_layout_with_its_tokenizer(tmp_path, tiny_gguf):
    model, tokenizer, _ = attnlab.load(tiny_gguf)
    written = model.save_pretrained(tmp_path / "hf", layout="huggingface", tokenizer=tokenizer)
    assert _config(written)["model_type"] == "llama" and _config(written)["tie_word_embeddings"] is True
    ids = torch.randint(3, 40, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(_hf_logits(written, ids), model(ids).logits, atol=TOLERANCE, rtol=0)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(written)
    text = "<|im_start|>abc ab<|im_end|>"
    assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text).ids
    assert (hf_tokenizer.bos_token, hf_tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
