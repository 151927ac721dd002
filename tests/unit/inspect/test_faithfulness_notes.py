"""What an explanation carries about its methods' measured faithfulness (inspect/faithfulness_notes.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.inspect.faithfulness import model_family
from attnlab.inspect.faithfulness_notes import default_method, faithfulness_notes
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder.causal_lm import DecoderForCausalLM


def test_a_model_family_is_its_transformers_type_or_attnlab_layout():
    transformers = pytest.importorskip("transformers")
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2))
    assert model_family(llama) == "llama"
    small = dict(vocab_size=16, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=8)
    assert model_family(DecoderForCausalLM(DecoderConfig(**small))) == "llama"
    gpt2_like = DecoderConfig(**small, norm="layer", feed_forward="plain", activation="gelu", position="learned")
    assert model_family(DecoderForCausalLM(gpt2_like)) == "gpt2"
    assert model_family(EncoderClassifier(TransformerEncoder(16, 16, 2, 1, 32, max_len=8), 2)) == "bert"
    assert model_family(nn.Linear(2, 2)) is None


def test_notes_mark_a_method_whose_interval_does_not_clear_random(measured_faithfulness):
    measured_faithfulness("decoder", "llama", {"raw": 3.0, "rollout": 1.15, "occlusion": 0.2})
    notes = faithfulness_notes("decoder", "llama", ["raw", "rollout", "occlusion", "attn-lrp"])
    methods = notes["methods"]
    assert methods["raw"]["at_or_below_random"] is False  # 2.9 > random's 1.1
    assert methods["rollout"]["at_or_below_random"] is True  # 1.05 .. 1.25 overlaps 0.9 .. 1.1
    assert methods["occlusion"]["at_or_below_random"] is True  # below random
    assert "AT OR BELOW RANDOM" in methods["occlusion"]["note"] and "above random" in methods["raw"]["note"]
    assert methods["attn-lrp"] == {"figures": {}, "at_or_below_random": None,
                                   "note": "not measured on a measured llama"}
    assert notes["random"] == {"deletion_aopc": pytest.approx([1.0, 0.9, 1.1])}
    assert notes["same_family"] is True and notes["measured_on"] == "a measured llama"


def test_another_family_lends_its_figures_and_says_so(measured_faithfulness):
    measured_faithfulness("decoder", "llama", {"raw": 3.0})
    notes = faithfulness_notes("decoder", "gemma3_text", ["raw"])
    assert notes["same_family"] is False and notes["family"] == "llama"
    assert "another decoder family" in notes["methods"]["raw"]["note"]
    assert faithfulness_notes("classifier", "bert", ["raw"]) is None  # nothing measured for the kind


def test_the_default_method_is_the_best_measured_one_the_model_offers(measured_faithfulness):
    measured_faithfulness("decoder", "llama", {"raw": 3.0, "occlusion": 5.0, "rollout": 0.5})
    assert default_method("decoder", "llama", ["raw", "occlusion", "rollout"]) == "occlusion"
    assert default_method("decoder", "llama", ["raw", "rollout"]) == "raw"
    assert default_method("decoder", "llama", ["attn-lrp"]) is None
    assert default_method("classifier", None, ["raw"]) is None


def test_the_packaged_figures_rank_a_method_for_each_kind():
    for kind, methods in (("decoder", ("raw", "rollout", "grad-attention", "integrated-gradients", "occlusion")),
                          ("classifier", ("raw", "rollout", "flow", "grad-attention", "relevance",
                                          "integrated-gradients"))):
        best = default_method(kind, None, methods)
        assert best in methods
        notes = faithfulness_notes(kind, None, [best])
        assert notes["methods"][best]["at_or_below_random"] is False, f"the default for a {kind} is not above random"
