"""grad-attention on a transformers image classifier, against Chefer et al.'s rule written out
on transformers' eager weights and their gradients (tiny random models built at test time)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the classifiers are transformers models")

from attnlab.hf.image_explanation import explain_image  # noqa: E402
from attnlab.hf.vision import image_attention  # noqa: E402
from attnlab.inspect.compute.rollout import attention_rollout  # noqa: E402

LABELS = {0: "cat", 1: "dog", 2: "car"}


def _classifier(name):
    torch.manual_seed(0)
    common = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    if name == "vit":
        return transformers.ViTForImageClassification(transformers.ViTConfig(**common)).eval()
    return transformers.DeiTForImageClassification(transformers.DeiTConfig(**common)).eval()


def _chefer_grad_attention(model, pixels, target, prefix, grid, **extra):
    """Generic Attention-model Explainability on eager weights: R = I; R += mean_h (grad * A)^+ R."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        out = model(pixel_values=pixels, output_attentions=True, **extra)
        gradients = torch.autograd.grad(out.logits[0, target], out.attentions)
    finally:
        model.set_attn_implementation(previous)
    relevance = torch.eye(out.attentions[0].shape[-1])
    for attention, gradient in zip(out.attentions, gradients):
        cam = (gradient[0] * attention[0]).clamp(min=0).mean(0)
        relevance = relevance + cam @ relevance
    return relevance[0, prefix:].reshape(grid).detach()


@pytest.mark.parametrize("name, prefix", [("vit", 1), ("deit", 2)])
@pytest.mark.parametrize("size", [(32, 32), (24, 40)])  # the model's own size, and interpolated positions
def test_grad_attention_equals_chefers_rule_on_eager_weights(name, prefix, size):
    model = _classifier(name)
    pixels = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    got = explain_image(model, pixels, target="dog")
    grid = (size[0] // 8, size[1] // 8)
    assert (got.target, got.label, got.grid, got.prefix) == (1, "dog", grid, prefix)
    extra = {"interpolate_pos_encoding": True} if size != (32, 32) else {}
    want = _chefer_grad_attention(model, pixels, 1, prefix, grid, **extra)
    torch.testing.assert_close(got.maps["grad-attention"], want, atol=1e-5, rtol=1e-5)
    seen = image_attention(model, pixels)
    rollout = attention_rollout([w[None] for w in seen.attentions.values()], head_fusion="max", discard_ratio=0.9)
    torch.testing.assert_close(got.maps["rollout"], rollout[-1, 0, 0, prefix:].reshape(grid))
    raw = list(seen.attentions.values())[-1][:, 0, prefix:].mean(0).reshape(grid)
    torch.testing.assert_close(got.maps["raw"], raw)
    assert not model.training and all(p.grad is None for p in model.parameters())


def test_the_prediction_is_explained_by_default_and_bad_input_is_named():
    model = _classifier("vit")
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    got = explain_image(model, pixels, ("grad-attention",))
    with torch.no_grad():
        predicted = int(model(pixel_values=pixels).logits.argmax())
    assert got.target == predicted and list(got.maps) == ["grad-attention"]
    assert got.top_classes[0][0] == LABELS[predicted] and abs(sum(p for _, p in got.top_classes) - 1) < 1e-5
    with pytest.raises(ValueError, match="methods must be among"):
        explain_image(model, pixels, ("flow",))
    with pytest.raises(ValueError, match="target 'bird' is not a class"):
        explain_image(model, pixels, target="bird")
    bare = transformers.ViTModel(model.config, add_pooling_layer=False).eval()
    with pytest.raises(ValueError, match="no \\[1, C\\] logits"):
        explain_image(bare, pixels)
