"""A GGUF file is parsed once by ``attnlab.load``: one reader serves the weights and the tokenizer.

Parsing SmolLM2's file (its 49k-token vocabulary and merges) takes seconds; it used to be
parsed twice, once for the weights and once for the tokenizer. A tiny Llama GGUF file is
written here with the ``gguf`` package.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab.checkpoints.gguf import weights as gguf_weights
from attnlab.models.decoder import DecoderForCausalLM

gguf = pytest.importorskip("gguf", reason="reading GGUF needs the gguf package (pip install gguf)")

TOKENS = ["<|endoftext|>", "<|im_start|>", *"abcdefgh", "ab", "cd"]
MERGES = ["a b", "c d"]
E, LAYERS, HEADS, KV_HEADS, FF = 16, 2, 4, 2, 24


def _tiny_gguf(path):
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(E)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TOKENS)
    writer.add_token_merges(MERGES)
    writer.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    writer.add_eos_token_id(0)

    def tensor(name, *shape):
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.3)

    D = E // HEADS
    tensor("token_embd.weight", len(TOKENS), E)
    tensor("output_norm.weight", E)
    for i in range(LAYERS):
        for name, shape in (("attn_norm", (E,)), ("ffn_norm", (E,)), ("attn_q", (HEADS * D, E)),
                            ("attn_k", (KV_HEADS * D, E)), ("attn_v", (KV_HEADS * D, E)),
                            ("attn_output", (E, E)), ("ffn_gate", (FF, E)), ("ffn_up", (FF, E)),
                            ("ffn_down", (E, FF))):
            tensor(f"blk.{i}.{name}.weight", *shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_load_parses_a_gguf_file_once_for_weights_and_tokenizer(tmp_path, monkeypatch):
    path = _tiny_gguf(tmp_path / "tiny.gguf")
    opened = []
    reader = gguf_weights._reader

    def counting(source):
        opened.append(source)
        return reader(source)

    monkeypatch.setattr(gguf_weights, "_reader", counting)
    model, tokenizer, config = attnlab.load(path)
    assert len(opened) == 1, opened
    assert isinstance(model, DecoderForCausalLM) and config["num_layers"] == LAYERS
    assert tokenizer.backend.token_to_id("<|im_start|>") == 1 and tokenizer.padding_side == "left"
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[2, 3, 4]])).logits).all()
    half = attnlab.load(path, dtype="bfloat16").model  # each tensor dequantised to float32, then converted
    assert {parameter.dtype for parameter in half.parameters()} == {torch.bfloat16}
    assert torch.equal(half.embed_tokens.weight, model.embed_tokens.weight.to(torch.bfloat16))
