"""CrossModalAttention: shapes, masks per direction, gating, and the article's defect 5."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import CrossModalAttention, CrossModalOutput
from attnlab.attention import MultiHeadAttention
from attnlab.attention.cross_modal import masked_mean

B, S, T, V, E, H = 2, 6, 5, 12, 16, 4


class _ArticleCrossModalAttention(nn.Module):
    """The article's block, transcribed (one shared attention module, wrong-side masks)."""

    def __init__(self, visual_dim, text_dim, num_heads, dropout=0.1):
        super().__init__()
        self.visual_proj = nn.Linear(visual_dim, text_dim)
        self.cross_attn = MultiHeadAttention(text_dim, num_heads, dropout)
        self.norm1 = nn.LayerNorm(text_dim)
        self.norm2 = nn.LayerNorm(text_dim)
        self.gate = nn.Sequential(nn.Linear(text_dim * 2, text_dim), nn.Sigmoid())

    def forward(self, visual_features, text_features, visual_mask=None, text_mask=None, need_weights=False):
        def as_mask(mask):
            return None if mask is None else mask[:, None, None, :]

        visual_projected = self.visual_proj(visual_features)
        cross_output, attn_weights = self.cross_attn(
            text_features, visual_projected, visual_projected, as_mask(visual_mask), need_weights=True
        )
        text_enhanced = self.norm1(text_features + cross_output)
        visual_cross_output, _ = self.cross_attn(
            visual_projected, text_features, text_features, as_mask(text_mask), need_weights=True
        )
        visual_enhanced = self.norm2(visual_projected + visual_cross_output)
        combined = torch.cat([text_enhanced, visual_enhanced.mean(dim=1, keepdim=True)], dim=-1)
        gate_weights = self.gate(combined)
        final_output = gate_weights * text_enhanced + (1 - gate_weights) * visual_enhanced.mean(dim=1, keepdim=True)
        return final_output, attn_weights


ARTICLE = pytest.param(
    _ArticleCrossModalAttention,
    id="article",
    marks=pytest.mark.xfail(strict=True, reason="defect 5: shared module, concat crash, masks"),
)
IMPLEMENTATIONS = [pytest.param(CrossModalAttention, id="attnlab"), ARTICLE]


def _inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    visual = torch.randn(B, S, V, generator=generator)
    text = torch.randn(B, T, E, generator=generator)
    visual_mask = torch.tensor([[True] * S, [True] * 4 + [False] * 2])
    text_mask = torch.tensor([[True] * T, [True] * 3 + [False] * 2])
    return visual, text, visual_mask, text_mask


def _module(gate: str = "sigmoid", **kwargs) -> CrossModalAttention:
    torch.manual_seed(0)
    return CrossModalAttention(V, E, H, dropout=0.0, gate=gate, **kwargs).eval()


# --- tests that the article's block fails -------------------------------------------------


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_fuses_text_longer_than_one_token(implementation):
    torch.manual_seed(0)
    module = implementation(V, E, H, 0.0).eval()
    visual, text, visual_mask, text_mask = _inputs()
    output, weights = module(visual, text, visual_mask, text_mask, need_weights=True)
    assert output.shape == (B, T, E)
    assert weights.shape == (B, H, T, S)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_directions_have_separate_parameters(implementation):
    module = implementation(V, E, H, 0.0)
    attentions = [m for m in module.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == 2
    first, second = (set(map(id, m.parameters())) for m in attentions)
    assert first and second and not first & second


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_real_text_positions_ignore_padded_tokens_and_patches(implementation):
    torch.manual_seed(0)
    module = implementation(V, E, H, 0.0).eval()
    visual, text, visual_mask, text_mask = _inputs()
    output, _ = module(visual, text, visual_mask, text_mask)
    visual2, text2 = visual.clone(), text.clone()
    visual2[~visual_mask] = 100.0
    text2[~text_mask] = -100.0
    output2, _ = module(visual2, text2, visual_mask, text_mask)
    torch.testing.assert_close(output2[text_mask], output[text_mask])


# --- shapes, masks and weights ---------------------------------------------------------------


@pytest.mark.parametrize("gate", ["sigmoid", "tanh0"])
def test_shapes_of_every_output(gate):
    module = _module(gate)
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask, need_weights=True)
    assert isinstance(result, CrossModalOutput)
    assert result.output.shape == (B, T, E)
    assert result.visual_output.shape == (B, S, E)
    assert result.text_to_visual_weights.shape == (B, H, T, S)
    assert result.visual_to_text_weights.shape == (B, H, S, T)
    assert result.gate.shape == ((B, T, E) if gate == "sigmoid" else ())
    output, weights = result
    assert output is result.output and weights is result.text_to_visual_weights


def test_weights_only_when_asked_and_same_output_either_way():
    module = _module()
    visual, text, visual_mask, text_mask = _inputs()
    fused = module(visual, text, visual_mask, text_mask)
    explicit = module(visual, text, visual_mask, text_mask, need_weights=True)
    assert fused.text_to_visual_weights is None and fused.visual_to_text_weights is None
    torch.testing.assert_close(fused.output, explicit.output)


def test_each_direction_gives_zero_weight_to_masked_items_of_the_other_modality():
    module = _module()
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask, need_weights=True)
    t2v, v2t = result.text_to_visual_weights, result.visual_to_text_weights
    assert torch.all(t2v[1, :, :, ~visual_mask[1]] == 0)  # text -> padded patches
    assert torch.all(v2t[1, :, :, ~text_mask[1]] == 0)  # patches -> padded tokens
    torch.testing.assert_close(t2v.sum(-1), torch.ones(B, H, T))
    torch.testing.assert_close(v2t.sum(-1), torch.ones(B, H, S))


@pytest.mark.parametrize("gate", ["sigmoid", "tanh0"])
def test_fully_masked_image_gives_finite_output_and_gradients(gate):
    module = _module(gate)
    with torch.no_grad():
        if module.gate_alpha is not None:
            module.gate_alpha.fill_(0.5)
    visual, text, _, text_mask = _inputs()
    visual.requires_grad_(True)
    text.requires_grad_(True)
    no_patches = torch.zeros(B, S, dtype=torch.bool)
    result = module(visual, text, no_patches, text_mask, need_weights=True)
    assert torch.isfinite(result.output).all()
    assert torch.all(result.text_to_visual_weights == 0)
    result.output.sum().backward()
    assert torch.isfinite(visual.grad).all() and torch.isfinite(text.grad).all()


def test_pooled_visual_context_is_a_mean_over_real_patches_only():
    x = torch.tensor([[[1.0], [3.0], [100.0]], [[2.0], [4.0], [6.0]]])
    mask = torch.tensor([[True, True, False], [False, False, False]])
    torch.testing.assert_close(masked_mean(x, mask), torch.tensor([[[2.0]], [[0.0]]]))
    torch.testing.assert_close(masked_mean(x, None), x.mean(1, keepdim=True))


def test_integer_masks_mean_the_same_as_bool():
    module = _module()
    visual, text, visual_mask, text_mask = _inputs()
    as_bool = module(visual, text, visual_mask, text_mask).output
    as_int = module(visual, text, visual_mask.long(), text_mask.int()).output
    torch.testing.assert_close(as_int, as_bool)


# --- gates --------------------------------------------------------------------------------


def test_tanh0_block_is_exactly_the_identity_at_initialisation():
    module = CrossModalAttention(V, E, H, dropout=0.1, gate="tanh0")  # train mode, with dropout
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask)
    assert torch.equal(result.output, text)
    assert result.gate.item() == 0.0


def test_tanh0_gate_gets_a_gradient_at_initialisation():
    module = _module("tanh0")
    visual, text, visual_mask, text_mask = _inputs()
    module(visual, text, visual_mask, text_mask).output.pow(2).sum().backward()
    assert module.gate_alpha.grad is not None and module.gate_alpha.grad.abs() > 0


def test_sigmoid_gate_lies_in_unit_interval_and_mixes_text_with_pooled_vision():
    module = _module("sigmoid")
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask)
    assert torch.all((result.gate > 0) & (result.gate < 1))
    pooled = masked_mean(module.visual_proj(visual), visual_mask)  # [B, 1, E]: the image's own patches
    enhanced = module.norm1(text + module.text_to_visual(text, module.visual_proj(visual),
                                                          module.visual_proj(visual),
                                                          attention_mask=visual_mask).output)
    expected = result.gate * enhanced + (1 - result.gate) * pooled
    torch.testing.assert_close(result.output, expected)


# --- construction and bad input --------------------------------------------------------------


def test_device_and_dtype_are_passed_to_parameters():
    module = CrossModalAttention(V, E, H, gate="tanh0", dtype=torch.float64)
    assert {p.dtype for p in module.parameters()} == {torch.float64}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gate": "relu"}, "gate"),
        ({"num_heads": 3}, "divisible"),
        ({"dropout": 1.5}, "dropout"),
        ({"visual_dim": 0}, "visual_dim"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    arguments = {"visual_dim": V, "text_dim": E, "num_heads": H, **kwargs}
    with pytest.raises(ValueError, match=message):
        CrossModalAttention(**arguments)


def test_bad_inputs_name_the_argument():
    module = _module()
    visual, text, visual_mask, text_mask = _inputs()
    with pytest.raises(ValueError, match="visual_features"):
        module(visual[..., :-1], text)
    with pytest.raises(ValueError, match="batch size"):
        module(visual[:1], text)
    with pytest.raises(ValueError, match="visual_mask"):
        module(visual, text, visual_mask[:, :-1])
    with pytest.raises(TypeError, match="text_mask is a float mask holding 0.5"):
        module(visual, text, visual_mask, text_mask.float() * 0.5)


def test_null_slot_takes_the_attention_the_patches_do_not_get():
    module = _module(null_slot=True)
    with torch.no_grad():
        module.null_slot.normal_()
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask, need_weights=True)
    patches = result.text_to_visual_weights  # [B, H, T, S], the patches only
    assert patches.shape == (B, H, T, S)
    assert torch.all(patches.sum(-1) < 1) and torch.all(patches[1, :, :, ~visual_mask[1]] == 0)
    nothing = module(visual, text, torch.zeros(B, S, dtype=torch.bool), text_mask, need_weights=True)
    assert torch.isfinite(nothing.output).all() and torch.all(nothing.text_to_visual_weights == 0)


def test_masks_of_the_article_shape_and_float_masks_read_like_padding_masks():
    module = _module("sigmoid").eval()
    visual, text, visual_mask, text_mask = _inputs()
    expected = module(visual, text, visual_mask, text_mask)
    article = module(visual, text, visual_mask[:, None, None, :], text_mask[:, None, None, :])
    floats = module(visual, text, visual_mask.float(), text_mask.float())
    for got in (article, floats):
        torch.testing.assert_close(got.output, expected.output, rtol=0, atol=0)


def test_output_behaves_like_a_model_output_and_the_article_pair():
    module = _module("sigmoid").eval()
    visual, text, visual_mask, text_mask = _inputs()
    result = module(visual, text, visual_mask, text_mask, need_weights=True)
    output, weights = result
    assert output is result.output and weights is result.text_to_visual_weights
    assert result[0] is result.output and result["gate"] is result.gate
    assert result.to_tuple() == (result.output, result.text_to_visual_weights)
