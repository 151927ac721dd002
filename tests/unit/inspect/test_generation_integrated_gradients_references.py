"""Integrated gradients of generated tokens against captum and inseq, for every baseline, on
tiny random transformers Llama and GPT-2 served by attnlab (as ``explain --prompt`` serves them),
in float64: same baseline, same points, Gauss-Legendre quadrature, same target tokens."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.inspect.compute.generation_attribution import attribute_generation
from attnlab.inspect.compute.integrated_gradients_baseline import BASELINES, mean_embedding
from attnlab.inspect.compute.integrated_gradients_steps import AUTO_STEPS, COMPLETENESS_TOLERANCE
from attnlab.inspect.compute.next_token_objective import token_embedding_module

transformers = pytest.importorskip("transformers", reason="the tiny decoders are made with transformers")

IDS = torch.tensor([[7, 12, 5, 9, 3]])  # 3 prompt tokens, 2 explained; no <unk> (0) or </s> (2) among them
P = 3
STEPS = 16
UNK = 0  # inseq's baseline token: the tokenizer's unknown token; attnlab's neutral id here


def _model(family: str):
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(vocab_size=20, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=20, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         bos_token_id=1, eos_token_id=2)
        model = transformers.GPT2LMHeadModel(config)
    return model.eval().double()


def _served(model):
    from attnlab.hf.opening import as_inspectable

    return as_inspectable(model)


def _ours(served, baseline: str, steps: int = STEPS):
    found = attribute_generation(served, IDS, P, ["integrated-gradients"], neutral_id=UNK, baseline=baseline,
                                 steps=steps)
    return found.scores["integrated-gradients"].double(), found.delta


def _close(ours, theirs):
    torch.testing.assert_close(ours, theirs.double(), rtol=1e-4, atol=1e-4 * float(theirs.abs().max()))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("baseline", BASELINES)
def test_equal_to_captums_integrated_gradients_on_the_embedding_layer(family, baseline):
    captum = pytest.importorskip("captum.attr")
    model = _model(family)
    served = _served(model)
    ours, _ = _ours(served, baseline)
    weight = model.get_input_embeddings().weight.detach()
    for g in range(IDS.shape[1] - P):
        prefix, target = IDS[:, : P + g], int(IDS[0, P + g])

        def log_p(logits):
            return torch.log_softmax(logits[:, -1], -1)[:, target]

        if baseline == "pad":  # token ids in: captum's LayerIntegratedGradients on the token embedding
            method = captum.LayerIntegratedGradients(lambda ids: log_p(model(input_ids=ids).logits),
                                                     model.get_input_embeddings())
            expected = method.attribute(prefix, baselines=torch.full_like(prefix, UNK), n_steps=STEPS)
        else:  # no token has these embeddings: captum's IntegratedGradients over inputs_embeds
            inputs = weight[prefix]
            start = torch.zeros_like(inputs) if baseline == "zero" else weight.mean(0).expand_as(inputs)
            method = captum.IntegratedGradients(lambda embeds: log_p(model(inputs_embeds=embeds).logits))
            expected = method.attribute(inputs, baselines=start, n_steps=STEPS)
        _close(ours[g, : P + g], expected.sum(-1)[0])
        assert torch.all(ours[g, P + g:] == 0)


def _inseq_model(model, method: str):
    inseq = pytest.importorskip("inseq")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocabulary = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 20)}}
    inner = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces, as inseq re-tokenizes its texts
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="</s>",
                                                     unk_token="<unk>", pad_token="<unk>")
    return inseq.load_model(model, method, tokenizer=tokenizer)


def _inseq_scores(model, method: str):
    """inseq's ``[N, G]`` scores of ``IDS`` (log-probability of each generated token; inseq's
    baseline: the unknown token at every position but </s>; captum's default Gauss-Legendre
    quadrature, which inseq cannot change: its own ``method`` argument names the attribution)."""
    words = [f"w{i}" for i in IDS[0].tolist()]
    attributed = _inseq_model(model, method).attribute(
        " ".join(words[:P]), " ".join(words), n_steps=STEPS, attributed_fn="probability", logprob=True,
        show_progress=False)
    sequence = attributed.sequence_attributions[0]
    assert [token.token for token in sequence.target] == words
    return sequence.target_attributions.sum(-1).nan_to_num(0.0)  # [N, G]; nan: positions not yet seen


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_pad_baseline_equals_inseqs_integrated_gradients(family):
    model = _model(family)
    ours, _ = _ours(_served(model), "pad")
    _close(ours, _inseq_scores(model, "integrated_gradients").T)


# What fails, seen on transformers 5.25 and captum 0.9: inseq 0.7.1's layer_integrated_gradients gives
# all-zero scores (on the bare transformers model too) and reports "Unused arguments during
# attribution: {'n_steps': ...}", so its points cannot even be set. captum's own
# LayerIntegratedGradients is checked above; strict, so a fixed inseq shows up here.
@pytest.mark.xfail(strict=True, reason="inseq 0.7.1's layer_integrated_gradients gives all-zero scores under "
                   "captum 0.9 and drops n_steps")
def test_the_pad_baseline_equals_inseqs_layer_integrated_gradients():
    model = _model("llama")
    ours, _ = _ours(_served(model), "pad")
    _close(ours, _inseq_scores(model, "layer_integrated_gradients").T)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_zero_and_mean_equal_inseq_on_a_model_whose_unknown_token_has_that_embedding(family, baseline):
    # inseq starts from the <unk> token's embedding. Giving <unk> the zero vector (or the mean of
    # the other rows, which then is the mean of all rows) changes no output on IDS, which holds no
    # <unk>, and makes inseq's baseline attnlab's "zero" (or "mean").
    model = copy.deepcopy(_model(family))
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight[UNK] = 0.0 if baseline == "zero" else weight[UNK + 1:].mean(0)
    served = _served(model)
    torch.testing.assert_close(mean_embedding(token_embedding_module(served)), weight.detach().mean(0))
    if baseline == "mean":
        torch.testing.assert_close(weight[UNK].detach(), weight.detach().mean(0))
    ours, _ = _ours(served, baseline)
    _close(ours, _inseq_scores(model, "integrated_gradients").T)


@pytest.mark.parametrize("baseline", BASELINES)
def test_auto_steps_bring_the_gap_under_five_percent_and_the_json_reports_each_rows_gap(baseline):
    from attnlab.workflows.explain_generation import explain_generation

    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab.data import Tokenizer as Wrapped

    inner = Tokenizer(models.WordLevel({"<unk>": 0, **{f"w{i}": i for i in range(1, 20)}}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    served = _served(_model("llama").float())
    explained, = explain_generation(served, Wrapped(inner), "w7 w12 w5", ["integrated-gradients"],
                                    continuation="w9 w3", baseline=baseline, neutral_id=UNK, lens=False)
    written = explained.to_dict()
    assert written["integrated_gradients_steps"] in AUTO_STEPS
    assert written["integrated_gradients_completeness_gap"] <= COMPLETENESS_TOLERANCE
    assert len(written["integrated_gradients_completeness_gaps"]) == 2
    assert max(written["integrated_gradients_completeness_gaps"]) == pytest.approx(
        written["integrated_gradients_completeness_gap"])
    assert written["integrated_gradients_baseline"] == baseline and written["integrated_gradients_complete"]
    one_point, = explain_generation(served, Wrapped(inner), "w7 w12 w5", ["integrated-gradients"],
                                    continuation="w9 w3", baseline=baseline, neutral_id=UNK, lens=False, steps=1)
    if one_point.integrated_gradients_gap > COMPLETENESS_TOLERANCE:
        assert one_point.to_dict()["integrated_gradients_note"].startswith("warning: 1 points")
        assert "warning: 1 points" in one_point.page()


def test_a_bad_baseline_is_refused_before_any_work():
    served = _served(_model("llama"))
    with pytest.raises(ValueError, match="baseline must be one of pad, zero, mean"):
        attribute_generation(served, IDS, P, ["integrated-gradients"], baseline="unk")
