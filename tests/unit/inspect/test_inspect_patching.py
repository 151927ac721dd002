"""Activation patching on heads and layers."""

from __future__ import annotations

import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.inspect.compute.capture import find_attention_modules
from attnlab.inspect.compute.patching import (
    head_patching_sweep,
    layer_patching_sweep,
    patch_heads,
    patch_layers,
)
from attnlab.models.classifier import EncoderClassifier

SOURCE = torch.tensor([[2, 5, 6, 7, 3]])
TARGET = torch.tensor([[2, 9, 6, 11, 3]])


@pytest.fixture
def model() -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=3, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 2).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_patching_a_whole_layer_output_gives_the_source_logit(model, layer):
    result = patch_layers(model, SOURCE, TARGET, [layer], label=1)
    assert torch.allclose(result.patched, result.source, atol=1e-5)
    assert torch.allclose(result.recovered, torch.ones(1), atol=1e-4)
    assert torch.allclose(result.clean, _logits(model, TARGET)[:, 1])


def test_patching_every_head_equals_replacing_the_attention_output(model):
    layer = find_attention_modules(model)["layer_2"]
    recorded = {}
    handle = layer.register_forward_hook(lambda m, a, out: recorded.update(out=out[0].clone()))
    source_logits = _logits(model, SOURCE)
    handle.remove()
    handle = layer.register_forward_hook(lambda m, a, out: (recorded["out"], out[1]))
    expected = _logits(model, TARGET)[0, 0]
    handle.remove()
    result = patch_heads(model, SOURCE, TARGET, {"layer_2": [0, 1, 2, 3]}, label=0)
    assert torch.allclose(result.patched[0], expected, atol=1e-5)
    assert torch.allclose(result.source[0], source_logits[0, 0])


def test_one_head_moves_the_logit_part_of_the_way_and_hooks_are_removed(model):
    before = _logits(model, TARGET)
    result = patch_heads(model, SOURCE, TARGET, {"layer_1": [2]})
    assert result.patched != result.clean and result.patched != result.source
    assert torch.equal(_logits(model, TARGET), before)


def test_the_same_input_changes_nothing(model):
    assert patch_heads(model, TARGET, TARGET, {"layer_3": [1]}).change.abs().max() == 0
    sweep = head_patching_sweep(model, TARGET, TARGET)
    assert sweep.shape == (3, 4) and sweep.abs().max() == 0


def test_sweeps_give_a_layers_by_heads_map(model):
    heads = head_patching_sweep(model, SOURCE, TARGET, label=1)
    layers = layer_patching_sweep(model, SOURCE, TARGET, label=1, recovered=True)
    assert heads.shape == (3, 4) and torch.isfinite(heads).all() and heads.abs().sum() > 0
    assert torch.allclose(layers, torch.ones(3), atol=1e-4)
    single = patch_heads(model, SOURCE, TARGET, {"layer_2": [3]}, label=1)
    assert torch.isclose(heads[1, 3], single.change[0])


def test_bad_requests_are_refused(model):
    with pytest.raises(ValueError, match="same shape"):
        patch_heads(model, SOURCE[:, :4], TARGET, {"layer_1": [0]})
    with pytest.raises(ValueError, match="unknown layer 'layer_9'"):
        patch_heads(model, SOURCE, TARGET, {"layer_9": [0]})
    with pytest.raises(ValueError, match="4 heads"):
        patch_heads(model, SOURCE, TARGET, {"layer_1": [4]})
    with pytest.raises(ValueError, match="0..2"):
        patch_layers(model, SOURCE, TARGET, [3])
