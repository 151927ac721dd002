"""Head masking and head importance (Michel et al., 2019)."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch import nn

from attnlab.inspect import AttentionAnalyzer, head_importance, head_mask_from, mask_heads


class ClassifierOutput(NamedTuple):
    logits: torch.Tensor
    attentions: object


class TinyClassifier(nn.Module):
    """Encoder + mean pooling + linear head, with the agreed forward signature."""

    def __init__(self, encoder, classes=2):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.d_model, classes, dtype=encoder.embedding.weight.dtype)

    def forward(self, input_ids, mask=None, *, output_attentions=False, head_mask=None):
        hidden, attentions = self.encoder(
            input_ids, mask, output_attentions=output_attentions, head_mask=head_mask
        )
        return ClassifierOutput(self.head(hidden.mean(1)), attentions)


def _batches():
    torch.manual_seed(3)
    return [
        (torch.randint(1, 20, (3, 6)), torch.tensor([0, 1, 1])),
        (torch.randint(1, 20, (2, 4)), torch.tensor([1, 0])),
    ]


def test_mask_heads_matches_the_model_head_mask(encoder):
    ids = torch.tensor([[5, 6, 7, 8]])
    remove = {"layer_1": [0, 2], "layer_2": [3]}
    mask = head_mask_from(encoder, remove)
    assert mask.tolist() == [[0, 1, 0, 1], [1, 1, 1, 0]]
    expected = encoder(ids, head_mask=mask).last_hidden_state
    before = [len(m._forward_pre_hooks) for m in encoder.modules()]
    with mask_heads(encoder, remove):
        got = encoder(ids).last_hidden_state
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(encoder(ids).last_hidden_state, expected)
    assert [len(m._forward_pre_hooks) for m in encoder.modules()] == before
    with pytest.raises(ValueError, match="unknown layer"):
        head_mask_from(encoder, {"layer_9": [0]})
    with pytest.raises(ValueError, match="head index"):
        head_mask_from(encoder, {"layer_1": [4]})


def test_head_importance_matches_finite_differences(encoder):
    model = TinyClassifier(encoder.double()).double().eval()
    batches = _batches()
    importance = head_importance(model, batches)
    assert importance.shape == (2, 4)

    def loss(xi, batch):
        ids, labels = batch
        return nn.functional.cross_entropy(model(ids, head_mask=xi).logits, labels)

    eps = 1e-5
    expected = torch.zeros(2, 4, dtype=torch.float64)
    with torch.no_grad():
        for batch in batches:
            for layer in range(2):
                for head in range(4):
                    step = torch.zeros(2, 4, dtype=torch.float64)
                    step[layer, head] = eps
                    ones = torch.ones(2, 4, dtype=torch.float64)
                    derivative = (loss(ones + step, batch) - loss(ones - step, batch)) / (2 * eps)
                    expected[layer, head] += derivative.abs() / len(batches)
    assert torch.allclose(importance.double(), expected, rtol=1e-4, atol=1e-8)
    normalised = head_importance(model, batches, normalize=True)
    assert torch.allclose(normalised.norm(dim=-1), torch.ones(2, dtype=normalised.dtype), atol=1e-5)


def test_default_loss_needs_labels(encoder):
    with pytest.raises(ValueError, match="loss_fn"):
        head_importance(encoder, [torch.tensor([[5, 6, 7]])])


def test_evaluate_with_heads_switched_off(encoder):
    model = TinyClassifier(encoder).eval()
    analyzer = AttentionAnalyzer(model)
    batches = _batches()
    full = analyzer.evaluate(batches)
    ablated = analyzer.evaluate(batches, head_mask={"layer_1": [0, 1, 2, 3], "layer_2": [0, 1, 2, 3]})
    assert full.examples == ablated.examples == 5
    assert full.accuracy is not None and 0.0 <= full.accuracy <= 1.0
    assert full.loss != pytest.approx(ablated.loss)
    stats = analyzer.analyze_attention_distribution(batches, head_mask={"layer_2": [1]})
    assert stats["entropy"][1][1] is None  # a switched-off head attends nowhere
    assert stats["entropy"][1][0] is not None
