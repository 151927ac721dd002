"""AttnLRP (``attn-lrp``) on decoders: equal to lxt's on the same model and input, for tiny random
models of every supported transformers family served by attnlab's backend and for attnlab's own
decoders; the forward values unchanged under the rules; everything given back; unknown modules
refused by name."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from attnlab.attention.interface import input_rule_of
from attnlab.hf.opening import as_inspectable
from attnlab.inspect.compute.attn_lrp import attn_lrp_generation
from attnlab.inspect.compute.attn_lrp_rules import attn_lrp_rules, refusal
from attnlab.inspect.compute.generation_attribution import (DEFAULT_GENERATION_METHODS, GENERATION_METHODS,
                                                            attribute_generation)
from attnlab.models.decoder import DecoderForCausalLM

from lxt_reference import lxt_relevance  # tests/unit/inspect/lxt_reference.py

transformers = pytest.importorskip("transformers", reason="the tiny decoders are made with transformers")

IDS = torch.tensor([[1, 7, 12, 5, 9, 3, 14]])  # 4 prompt tokens, 3 explained
P = 4
SIZES = dict(vocab_size=20, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SIZES),
    "qwen2": lambda: transformers.Qwen2Config(**SIZES),
    "qwen3": lambda: transformers.Qwen3Config(**SIZES, head_dim=8),
    "gemma3": lambda: transformers.Gemma3TextConfig(**SIZES, head_dim=8),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=20, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                            initializer_range=0.2),
}


@functools.cache
def _built(family: str) -> nn.Module:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[family]()).eval()
    with torch.no_grad():  # biases start at 0 and norms at 1 (Gemma's at 0): give them some spread
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    return model


def tiny(family: str, attention: str = "sdpa") -> nn.Module:
    """A tiny random causal LM of ``family``, a fresh copy of the same weights every call."""
    model = copy.deepcopy(_built(family))
    model.set_attn_implementation(attention)
    return model


def reference(family: str, model_family: str | None = None) -> torch.Tensor:
    """lxt's ``[G, N]`` relevances on the eager twin of :func:`tiny`."""
    eager = tiny(family, "eager")
    positions = list(range(P - 1, IDS.shape[1] - 1))
    return lxt_relevance(eager, IDS, model_family or family, positions, IDS[0, P:].tolist())


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, rtol: float = 1e-4) -> None:
    """Every entry within ``rtol`` of the largest relevance."""
    assert ours.shape == theirs.shape
    scale = theirs.abs().max()
    assert scale > 0
    assert float((ours.double() - theirs.double()).abs().max() / scale) <= rtol


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_equal_to_lxt_through_attnlabs_backend(family):
    model = as_inspectable(tiny(family))
    result = attn_lrp_generation(model, IDS, P)
    assert_close(result.scores, reference(family))
    assert torch.allclose(result.total, result.scores.sum(-1))
    with torch.no_grad():
        logits = model(IDS).logits[0]
    expected = logits[torch.arange(P - 1, IDS.shape[1] - 1), IDS[0, P:]]
    assert torch.allclose(result.logit, expected)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_attnlabs_own_decoder_equal_to_lxt_on_the_same_weights(family, tmp_path):
    tiny(family).save_pretrained(tmp_path)
    own = DecoderForCausalLM.from_pretrained(tmp_path).eval()
    assert_close(attn_lrp_generation(own, IDS, P).scores, reference(family))


def test_contrastive_relevance_is_the_difference_of_the_two_logits_relevances():
    model = as_inspectable(tiny("llama"))
    ids = IDS[:, : P + 1]
    with_foil = ids.clone()
    with_foil[0, P] = 4  # the foil explained on the same prefix
    contrast = attn_lrp_generation(model, ids, P, torch.tensor([4]))
    target, foil = attn_lrp_generation(model, ids, P), attn_lrp_generation(model, with_foil, P)
    assert torch.allclose(contrast.logit, target.logit - foil.logit, atol=1e-6)
    assert torch.allclose(contrast.scores, target.scores - foil.scores, atol=1e-6)
    assert contrast.scores.abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt2"])
def test_forward_values_unchanged_and_everything_given_back(family):
    model = as_inspectable(tiny(family))
    with torch.no_grad():
        before = model(IDS).logits
        with attn_lrp_rules(model):
            during = model(IDS).logits
            assert any("forward" in vars(module) for module in model.modules())
        after = model(IDS).logits
    assert torch.equal(before, during) and torch.equal(before, after)
    assert not any("forward" in vars(module) for module in model.modules())
    assert all(input_rule_of(site.module) is None for site in model.attention_sites())


def test_given_back_when_the_block_raises(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    own = DecoderForCausalLM.from_pretrained(tmp_path).eval()
    with pytest.raises(RuntimeError, match="inside"):
        with attn_lrp_rules(own):
            raise RuntimeError("inside")
    assert not any("forward" in vars(module) for module in own.modules())
    assert all(input_rule_of(layer.self_attn) is None for layer in own.layers)


class OddNorm(nn.Module):
    def forward(self, x):
        return x / x.norm(dim=-1, keepdim=True)


def test_unknown_module_refused_by_name(tmp_path):
    tiny("llama").save_pretrained(tmp_path)
    own = DecoderForCausalLM.from_pretrained(tmp_path).eval()
    own.layers[1].ffn_norm = OddNorm()
    with pytest.raises(ValueError, match=r"no AttnLRP rule for OddNorm \(at layers\.1\.ffn_norm\)"):
        attn_lrp_generation(own, IDS, P)
    assert "OddNorm" in refusal(own)
    assert not any("forward" in vars(module) for module in own.modules())


def test_unknown_transformers_family_refused_by_name():
    torch.manual_seed(0)
    config = transformers.OPTConfig(vocab_size=20, hidden_size=32, ffn_dim=48, num_hidden_layers=1,
                                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32)
    model = as_inspectable(transformers.OPTForCausalLM(config).eval())
    with pytest.raises(ValueError, match="no AttnLRP rule for OPT"):
        attn_lrp_generation(model, IDS, P)


def test_attribute_generation_branch():
    model = as_inspectable(tiny("qwen3"))
    result = attribute_generation(model, IDS, P, ["attn-lrp"])
    direct = attn_lrp_generation(model, IDS, P)
    assert result.scores["attn-lrp"].shape == (3, 7)
    assert torch.allclose(result.scores["attn-lrp"], direct.scores)
    assert torch.equal(result.attn_lrp_logit, direct.logit) and torch.equal(result.attn_lrp_sum, direct.total)
    assert "attn-lrp" in GENERATION_METHODS and "attn-lrp" not in DEFAULT_GENERATION_METHODS
