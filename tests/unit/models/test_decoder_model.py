"""DecoderForCausalLM and generate on a random model: inputs checked, training works, sampling options."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.decoder import DecoderConfig, DecoderForCausalLM
from attnlab.models.decoder.generation import next_token_scores


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=48, num_kv_heads=2,
                           eos_id=1)
    return DecoderForCausalLM(config).eval()


def test_loss_is_finite_and_gradients_reach_every_parameter(model):
    model.train()
    ids = torch.randint(2, 50, (2, 7))
    out = model(ids, labels=ids)
    out.loss.backward()
    model.eval()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.zero_grad(set_to_none=True)


def test_outputs_follow_the_output_contract(model):
    ids = torch.randint(2, 50, (1, 5))
    out = model(ids, output_attentions=True, output_hidden_states=True)
    assert out[0] is out.logits and out["attentions"] is out.attentions
    assert list(out.attentions.keys()) == ["layer_1", "layer_2"] and len(out.hidden_states) == 3


@pytest.mark.parametrize("kwargs, error, message", [
    ({"attention_mask": torch.ones(1, 4)}, ValueError, r"attention_mask must be \[B, S\] = \[1, 5\]"),
    ({"attention_mask": torch.full((1, 5), 0.5)}, TypeError, "keep masks"),
])
def test_bad_forward_inputs_are_refused(model, kwargs, error, message):
    with pytest.raises(error, match=message):
        model(torch.randint(2, 50, (1, 5)), **kwargs)


def test_float_ids_are_refused(model):
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        model(torch.rand(1, 5))


@pytest.mark.parametrize("options, message", [
    ({"temperature": 0}, "temperature must be > 0"),
    ({"top_k": 0}, "top_k must be an int >= 1"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"max_new_tokens": -1}, "max_new_tokens must be an int >= 0"),
])
def test_bad_generation_options_are_refused(model, options, message):
    with pytest.raises(ValueError, match=message):
        model.generate(torch.randint(2, 50, (1, 3)), **options)


def test_generation_stops_at_eos_and_pads_after_it(model):
    ids = torch.randint(2, 50, (3, 4))
    first = model.generate(ids, max_new_tokens=6, eos_token_id=-1).sequences[:, 4]
    stopped = model.generate(ids, max_new_tokens=6, eos_token_id=int(first[0]), pad_token_id=0).sequences
    assert stopped[0, 4] == first[0] and (stopped[0, 5:] == 0).all()


def test_top_k_and_top_p_keep_the_best_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isfinite(next_token_scores(logits, top_k=2)).sum() == 2
    kept = torch.isfinite(next_token_scores(logits, top_p=0.5))
    assert kept.tolist() == [[True, False, False, False, False]]
    assert torch.isfinite(next_token_scores(logits, top_p=0.9)).sum() == 3


def test_right_padding_is_refused_by_generate(model):
    ids = torch.randint(2, 50, (2, 4))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="pad on the left"):
        model.generate(ids, mask, max_new_tokens=2)
