"""The logit lens against a manual per-layer computation on transformers' own tiny Llama and GPT-2."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.compute.logit_lens import logit_lens
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip("transformers", reason="the tiny decoders are made with transformers")

IDS = torch.tensor([[1, 7, 12, 5, 9, 3]])


def _tiny(kind, directory):
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=20, n_embd=32, n_layer=3, n_head=4, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
    model.eval().save_pretrained(directory)
    return model


def _manual(reference, kind):
    """Per layer: the hidden state after it, the final norm, the LM head; the last layer: the logits."""
    with torch.no_grad():
        out = reference(input_ids=IDS, output_hidden_states=True)
        norm = reference.model.norm if kind == "llama" else reference.transformer.ln_f
        rows = [reference.lm_head(norm(state[0])) for state in out.hidden_states[:-1]] + [out.logits[0]]
    return torch.softmax(torch.stack(rows), -1)  # [L + 1, N, V]


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_attnlabs_decoder_reads_what_the_manual_computation_reads(kind, tmp_path):
    reference = _tiny(kind, tmp_path)
    expected = _manual(reference, kind)
    lens = logit_lens(DecoderForCausalLM.from_pretrained(tmp_path).eval(), IDS, positions=torch.arange(5), top_k=3)
    assert lens.layers == ["embeddings", "layer_1", "layer_2", "layer_3"]
    top = expected[:, :5].topk(3, -1)
    torch.testing.assert_close(lens.top_probabilities, top.values, atol=1e-5, rtol=1e-4)
    assert torch.equal(lens.top_ids, top.indices)
    targets = IDS[0, 1:]
    chosen = expected[:, torch.arange(5), targets]  # [L + 1, 5]
    torch.testing.assert_close(lens.target_probabilities, chosen, atol=1e-5, rtol=1e-4)
    ranks = (expected[:, :5] > chosen[..., None]).sum(-1) + 1
    assert torch.equal(lens.target_ranks, ranks)


def test_a_transformers_model_reads_the_same(tmp_path):
    from attnlab.hf.opening import TransformersModel

    reference = _tiny("llama", tmp_path)
    expected = _manual(reference, "llama")
    served = TransformersModel(transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval())
    lens = logit_lens(served, IDS, top_k=4)
    assert lens.target_ids is None  # the last position has no next token in the input
    top = expected.topk(4, -1)
    torch.testing.assert_close(lens.top_probabilities, top.values, atol=1e-5, rtol=1e-4)
