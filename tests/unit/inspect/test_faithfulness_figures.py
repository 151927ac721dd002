"""The measured-faithfulness reader: choosing a method, comparing with random, lending another
family's figures, the packaged file itself, and the family key of attnlab's and transformers' models."""

from __future__ import annotations

import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.decoder import DecoderForCausalLM
from attnlab.inspect import faithfulness
from attnlab.inspect.compute.generation_attribution import GENERATION_METHODS
from attnlab.inspect.compute.token_attribution import METHODS
from attnlab.inspect.faithfulness import MEASURES, faithfulness_for, load_figures, model_family
from attnlab.serve.faithfulness import faithfulness_of

DIRECTIONS = {"deletion_aopc": True, "insertion_aopc": True, "soft_comprehensiveness": True,
              "soft_sufficiency": False}


def _entry(family: str, kind: str, rows: dict[str, list[float]]) -> dict:
    return {"family": family, "kind": kind, "model": f"a {family} model", "quantity": "q", "texts": 50,
            "figures": {measure: dict(rows) for measure in MEASURES}}


FIGURES = {
    "command": "python benchmarks/faithfulness.py", "cpu": "a CPU", "primary": "deletion_aopc",
    "measures": {measure: {"higher_is_better": up, "about": "..."} for measure, up in DIRECTIONS.items()},
    "families": [
        _entry("llama", "decoder", {"random": [4.0, 3.5, 4.5], "raw": [6.0, 5.0, 7.0],
                                    "occlusion": [5.0, 4.4, 5.6], "rollout": [3.0, 2.0, 3.4]}),
        _entry("gemma3_text", "decoder", {"random": [9.0, 8.0, 10.0], "raw": [1.0, 0.5, 1.5]}),
        _entry("bert", "classifier", {"random": [0.2, 0.1, 0.3], "integrated-gradients": [0.6, 0.5, 0.7]}),
    ],
}


@pytest.fixture
def figures(monkeypatch):
    monkeypatch.setattr(faithfulness, "load_figures", lambda: FIGURES)


def test_best_method_never_picks_random(figures):
    measured = faithfulness_for("decoder", "llama")
    assert measured.best_method() == "raw"
    assert measured.best_method(["occlusion", "rollout", "random"]) == "occlusion"
    assert measured.best_method(["grad-attention", "flow"]) is None  # never measured
    lent = faithfulness_for("decoder", "gemma3_text")
    assert lent.best_method() == "raw"  # random (9.0) is higher, but it is no method


def test_best_method_takes_the_best_mean_rank_over_the_measures_and_the_primary_breaks_ties(monkeypatch):
    rows = {"random": [4.0, 3.5, 4.5], "first": [9.0, 8.0, 10.0], "second": [6.0, 5.5, 6.5]}
    entry = _entry("llama", "decoder", rows)
    for measure in ("insertion_aopc", "soft_comprehensiveness"):  # "second" wins three of the four
        entry["figures"][measure] = {**rows, "first": [5.0, 4.5, 5.5], "second": [6.0, 5.5, 6.5]}
    entry["figures"]["soft_sufficiency"] = {**rows, "first": [5.0, 4.5, 5.5], "second": [4.0, 3.5, 4.5]}
    monkeypatch.setattr(faithfulness, "load_figures", lambda: {**FIGURES, "families": [entry]})
    assert faithfulness_for("decoder", "llama").best_method() == "second"  # though "first" leads the primary
    tied = _entry("llama", "decoder", rows)
    tied["figures"]["soft_sufficiency"] = {**rows, "first": [6.0, 5.5, 6.5], "second": [5.0, 4.5, 5.5]}
    tied["figures"]["insertion_aopc"] = {**rows, "first": [5.0, 4.5, 5.5], "second": [6.0, 5.5, 6.5]}
    monkeypatch.setattr(faithfulness, "load_figures", lambda: {**FIGURES, "families": [tied]})
    assert faithfulness_for("decoder", "llama").best_method() == "first"  # ranks 0, 1, 0, 1 each: primary


def test_at_or_below_random_on_a_higher_is_better_measure(figures):
    measured = faithfulness_for("decoder", "llama")
    assert not measured.at_or_below_random("raw")  # 5.0 > random's 4.5
    assert measured.at_or_below_random("occlusion")  # 4.4 does not clear 4.5: the intervals overlap
    assert measured.at_or_below_random("rollout", "insertion_aopc")


def test_at_or_below_random_on_a_lower_is_better_measure(figures):
    measured = faithfulness_for("decoder", "llama")
    assert not measured.at_or_below_random("rollout", "soft_sufficiency")  # 3.4 < random's 3.5
    assert measured.at_or_below_random("raw", "soft_sufficiency")  # 5.0 is not below 3.5
    assert measured.at_or_below_random("occlusion", "soft_sufficiency")


def test_at_or_below_random_refuses_what_was_not_measured(figures):
    measured = faithfulness_for("decoder", "llama")
    with pytest.raises(ValueError, match="flow"):
        measured.at_or_below_random("flow")
    with pytest.raises(ValueError, match="sparsity"):
        measured.at_or_below_random("raw", "sparsity")


def test_an_unmeasured_family_borrows_the_first_entry_of_its_kind(figures):
    own = faithfulness_for("decoder", "llama")
    assert own.same_family and own.family == "llama"
    lent = faithfulness_for("decoder", "qwen3")
    assert (lent.family, lent.same_family) == ("llama", False)
    assert (faithfulness_for("decoder").family, faithfulness_for("decoder").same_family) == ("llama", False)
    assert faithfulness_for("classifier", "llama").family == "bert"  # a family of the other kind is not used
    assert faithfulness_for("encoder") is None and faithfulness_for("speech", "llama") is None


def test_to_json_is_the_entry_and_the_reading(figures):
    found = faithfulness_for("classifier", "bert").to_json()
    assert found["figures"] == FIGURES["families"][2]["figures"] and found["primary"] == "deletion_aopc"
    assert found["higher_is_better"] == DIRECTIONS and found["same_family"] is True


def test_the_page_gets_the_primary_figures_and_the_marks(figures):
    served = faithfulness_of("decoder", "llama")
    assert served["aopc"] == {"raw": 6.0, "occlusion": 5.0, "rollout": 3.0} and served["random"] == 4.0
    assert served["interval"]["raw"] == [5.0, 7.0]
    assert served["at_or_below_random"] == ["occlusion", "rollout"]
    assert served["measured_on"] == "a llama model (50 texts)"
    assert faithfulness_of("encoder") is None


def test_the_packaged_file_has_every_measure_for_every_method_of_each_kind():
    data = load_figures()
    assert set(data["measures"]) == set(MEASURES) and data["primary"] in MEASURES
    assert not data["measures"]["soft_sufficiency"]["higher_is_better"]
    kinds = {"decoder": GENERATION_METHODS, "classifier": METHODS}
    assert {entry["kind"] for entry in data["families"]} == set(kinds)
    for entry in data["families"]:
        assert entry["texts"] >= 1 and entry["quantity"]
        for measure in MEASURES:
            rows = entry["figures"][measure]
            assert set(rows) == {*kinds[entry["kind"]], "random"}, (entry["family"], measure)
            assert all(low <= mean <= high for mean, low, high in rows.values())
        measured = faithfulness_for(entry["kind"], entry["family"])
        assert measured.same_family and measured.best_method() in kinds[entry["kind"]]


def test_model_family_of_attnlab_and_transformers_models():
    torch.manual_seed(0)
    encoder = TransformerEncoder(50, 16, 2, 2, 32, max_len=16)
    assert model_family(EncoderClassifier(encoder, 2)) == "bert"
    config = dict(vocab_size=30, d_model=8, num_layers=1, num_heads=2, d_ff=16)
    assert model_family(DecoderForCausalLM(DecoderConfig(**config))) == "llama"
    learned = DecoderConfig(**config, position="learned", norm="layer")
    assert model_family(DecoderForCausalLM(learned)) == "gpt2"
    transformers = pytest.importorskip("transformers")
    tiny = transformers.Qwen2Config(vocab_size=30, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2)
    assert model_family(transformers.Qwen2ForCausalLM(tiny)) == "qwen2"
    assert model_family(torch.nn.Linear(2, 2)) is None
