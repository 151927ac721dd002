"""capture_attention: right weights, eval mode, clean hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention
from attnlab.inspect import capture_attention, find_attention_modules


def _hook_counts(model: nn.Module) -> list[tuple[int, int]]:
    return [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]


def test_weights_match_output_attentions_and_names(encoder):
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    expected = encoder(ids, output_attentions=True).attentions
    with capture_attention(encoder) as captured:
        hidden, attentions = encoder(ids)  # the model is called without asking for weights
    assert attentions is None
    assert list(captured.attentions) == ["layer_1", "layer_2"]
    assert captured.paths == {"layer_1": "layers.0.self_attn", "layer_2": "layers.1.self_attn"}
    for name, weights in expected.items():
        assert torch.equal(captured.attentions[name], weights)
    assert captured.stacked().shape == (2, 2, 4, 4, 4)


def test_eval_mode_inside_and_modes_restored(encoder):
    encoder.train()
    encoder.layers[1].eval()  # a mixed state must come back exactly
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with capture_attention(encoder) as first:
        assert not any(module.training for module in encoder.modules())
        encoder(ids)
    with capture_attention(encoder) as second:
        encoder(ids)
    assert torch.equal(first.attentions["layer_1"], second.attentions["layer_1"])  # no dropout
    assert encoder.training and encoder.layers[0].training and not encoder.layers[1].training


def test_hooks_removed_when_forward_raises_and_user_hooks_kept(encoder):
    calls = []
    user_pre = encoder.layers[0].self_attn.register_forward_pre_hook(lambda m, a: calls.append("pre"))
    user_post = encoder.layers[0].self_attn.register_forward_hook(lambda m, a, o: calls.append("post"))
    before = _hook_counts(encoder)
    with pytest.raises(ValueError, match="input_ids"):
        with capture_attention(encoder):
            encoder(torch.tensor([[5, 999]]))  # out of vocabulary: the forward raises
    assert _hook_counts(encoder) == before
    with pytest.raises(RuntimeError, match="boom"):
        with capture_attention(encoder) as captured:
            encoder(torch.tensor([[5, 6]]))
            assert captured.attentions
            raise RuntimeError("boom")
    assert _hook_counts(encoder) == before
    encoder(torch.tensor([[5, 6]]))
    assert calls[-2:] == ["pre", "post"]
    user_pre.remove()
    user_post.remove()
    assert _hook_counts(encoder) == [(0, 0)] * len(before)


def test_duck_typed_and_torch_attention_modules():
    class Custom(nn.Module):
        """Not a MultiHeadAttention, same calling convention."""

        num_heads = 2

        def forward(self, x, *, need_weights=False):
            weights = torch.softmax(x @ x.transpose(1, 2), -1)[:, None].expand(-1, 2, -1, -1)
            return x, (weights if need_weights else None)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.torch_attention = nn.MultiheadAttention(8, 2, batch_first=True)
            self.custom = Custom()
            self.ours = MultiHeadAttention(8, 2, dropout=0.0)

        def forward(self, x):
            x = self.torch_attention(x, x, x)[0]
            x = self.custom(x)[0]
            return self.ours(x, x, x)[0]

    model = Model()
    assert list(find_attention_modules(model).values()) == [model.torch_attention, model.custom, model.ours]
    with capture_attention(model) as captured:
        model(torch.randn(3, 5, 8))
    assert {name: tuple(w.shape) for name, w in captured.attentions.items()} == {
        "layer_1": (3, 2, 5, 5),  # per head, not averaged
        "layer_2": (3, 2, 5, 5),
        "layer_3": (3, 2, 5, 5),
    }


def test_explicit_modules_and_no_attention():
    with pytest.raises(ValueError, match="no attention module"):
        with capture_attention(nn.Linear(3, 3)):
            pass
    attention = MultiHeadAttention(8, 2, dropout=0.0)
    with capture_attention(attention, modules=[attention]) as captured:
        x = torch.randn(1, 3, 8)
        out, weights = attention(x, x, x)
    assert weights is not None and torch.equal(captured.attentions["layer_1"], weights)
