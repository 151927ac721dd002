"""Attribution of generated tokens on a tiny random Llama made by transformers at test time:
occlusion by hand, integrated gradients against captum, the attention methods against the
captured maps, contrastive objectives."""

from __future__ import annotations

import pytest
import torch

from attnlab.inspect.compute.generation_attribution import GENERATION_METHODS, attribute_generation
from attnlab.inspect.compute.occlusion import occlusion_scores
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip("transformers", reason="the tiny decoder is made with transformers")

IDS = torch.tensor([[1, 7, 12, 5, 9, 3, 14]])  # 4 prompt tokens, 3 explained
P = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same random weights as transformers' LlamaForCausalLM and attnlab's decoder."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(directory)
    return reference, DecoderForCausalLM.from_pretrained(directory).eval()


def _log_prob(model, prefix, target, foil=None):
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=prefix).logits[0, -1].double(), -1)
    return float(log_probs[target] - (log_probs[foil] if foil is not None else 0.0))


def test_occlusion_by_hand(pair):
    reference, model = pair
    scores = occlusion_scores(model, IDS, P, neutral_id=0)
    assert scores.shape == (3, 7)
    for g in range(3):
        position = P + g - 1
        prefix, target = IDS[:, : position + 1], int(IDS[0, P + g])
        full = _log_prob(reference, prefix, target)
        for s in range(7):
            if s > position:
                assert scores[g, s] == 0
                continue
            occluded = prefix.clone()
            occluded[0, s] = 0
            assert scores[g, s].item() == pytest.approx(full - _log_prob(reference, occluded, target), abs=2e-5)


def test_contrastive_occlusion_is_the_difference_of_two_log_probabilities(pair):
    reference, model = pair
    foil = torch.tensor([4, 4, 4])
    scores = occlusion_scores(model, IDS, P, neutral_id=0, foil_ids=foil)
    prefix, target = IDS[:, :P], int(IDS[0, P])
    occluded = prefix.clone()
    occluded[0, 2] = 0
    expected = _log_prob(reference, prefix, target, 4) - _log_prob(reference, occluded, target, 4)
    assert scores[0, 2].item() == pytest.approx(expected, abs=2e-5)


@pytest.mark.parametrize("foil", [None, 4])
def test_integrated_gradients_equal_captums_layer_integrated_gradients(pair, foil):
    captum = pytest.importorskip("captum.attr")
    reference, model = pair
    baseline = torch.zeros_like(IDS)
    result = attribute_generation(model, IDS, P, ["integrated-gradients"], neutral_id=0, steps=20,
                                  foil_ids=foil)
    scores = result.scores["integrated-gradients"]
    for g in range(3):
        prefix = IDS[:, : P + g]
        target = int(IDS[0, P + g])

        def forward(ids):
            log_probs = torch.log_softmax(reference(input_ids=ids).logits[:, -1].float(), -1)
            return log_probs[:, target] - (log_probs[:, foil] if foil is not None else 0.0)

        method = captum.LayerIntegratedGradients(forward, reference.get_input_embeddings())
        expected = method.attribute(prefix, baselines=baseline[:, : P + g], n_steps=20).sum(-1)[0]
        torch.testing.assert_close(scores[g, : P + g], expected.float(), atol=1e-5, rtol=0)
        assert torch.all(scores[g, P + g:] == 0)


def test_integrated_gradients_add_up_to_the_objectives_change(pair):
    _, model = pair
    # the pad embedding is zero, where RMSNorm bends sharply: the quadrature needs many points
    result = attribute_generation(model, IDS, P, ["integrated-gradients"], neutral_id=0, steps=300, foil_ids=4)
    assert result.delta.abs().max() < 1e-3


def test_attention_methods_read_the_predicting_rows(pair):
    reference, model = pair
    result = attribute_generation(model, IDS, P, ["raw", "rollout", "grad-attention"])
    with torch.no_grad():
        attentions = model(IDS, output_attentions=True).attentions
    last = attentions[-1][0].mean(0)  # [N, N]
    torch.testing.assert_close(result.scores["raw"], last[P - 1: -1] * torch.ones(3, 7).tril(P - 1))
    assert torch.allclose(result.scores["rollout"].sum(-1), torch.ones(3), atol=1e-5)  # rows of a rollout
    # grad-attention starts from the identity: the predicting position keeps at least 1
    rows = result.scores["grad-attention"]
    assert all(rows[g, P - 1 + g] >= 1 - 1e-6 for g in range(3)) and torch.all(rows[:, -1] == 0)
    # attention through transformers' own eager kernel: the same head mean
    reference.set_attn_implementation("eager")
    with torch.no_grad():
        theirs = reference(input_ids=IDS, output_attentions=True).attentions[-1][0].mean(0)
    torch.testing.assert_close(last, theirs, atol=1e-5, rtol=1e-4)


def test_every_method_runs_and_the_objective_is_the_log_probability(pair):
    reference, model = pair
    result = attribute_generation(model, IDS, P, GENERATION_METHODS, steps=8)
    assert list(result.scores) == list(GENERATION_METHODS)
    for g in range(3):
        expected = _log_prob(reference, IDS[:, : P + g], int(IDS[0, P + g]))
        assert result.objective[g].item() == pytest.approx(expected, abs=1e-5)


def test_bad_arguments_are_refused_before_any_work(pair):
    _, model = pair
    with pytest.raises(ValueError, match="prompt_length"):
        attribute_generation(model, IDS, 7)
    with pytest.raises(ValueError, match="unknown method 'flow'"):
        attribute_generation(model, IDS, P, ["flow"])
    with pytest.raises(ValueError, match="foil_ids"):
        attribute_generation(model, IDS, P, ["occlusion"], foil_ids=torch.tensor([1, 2]))
