"""TransformerEncoder: outputs, masks, positions, heads, embeddings, configuration."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab import EncoderConfig, EncoderOutput, TransformerEncoder
from attnlab.attention import causal_mask

VOCAB, E, LAYERS, HEADS, FF = 50, 32, 2, 4, 64


def _model(**options) -> TransformerEncoder:
    settings = {"pad_id": 0, "max_len": 32, "dropout": 0.1}
    settings.update(options)
    return TransformerEncoder(VOCAB, d_model=E, num_layers=LAYERS, num_heads=HEADS, d_ff=FF, **settings).eval()


def _ids() -> torch.Tensor:
    return torch.tensor([[5, 6, 7, 8, 9, 0, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]])


def test_output_is_a_named_tuple_that_unpacks() -> None:
    model = _model()
    result = model(_ids())
    assert isinstance(result, EncoderOutput)
    x, attentions = model(_ids())
    assert x.shape == (2, 8, E)
    assert attentions is None and result.attentions is None
    torch.testing.assert_close(result.last_hidden_state, x)


def test_attentions_per_layer_and_head_when_asked() -> None:
    model = _model()
    x, attentions = model(_ids(), output_attentions=True)
    assert list(attentions.keys()) == [f"layer_{i}" for i in range(1, LAYERS + 1)]
    for weights in attentions.values():
        assert weights.shape == (2, HEADS, 8, 8)
        assert torch.equal(weights[0, :, :, 5:], torch.zeros(HEADS, 8, 3))  # padded keys
        assert torch.equal(weights[0, :, 5:], torch.zeros(HEADS, 3, 8))  # padded queries (skipped)
        real_rows = (_ids() != 0)[:, None, :].expand(-1, HEADS, -1)
        torch.testing.assert_close(weights.sum(-1)[real_rows], torch.ones(int(real_rows.sum())))
    # Asking for weights switches to the reference path; the hidden states agree.
    torch.testing.assert_close(x, model(_ids()).last_hidden_state, rtol=0, atol=1e-5)


def test_pad_id_mask_equals_explicit_mask() -> None:
    model = _model()
    ids = _ids()
    derived, _ = model(ids)
    real = ids != 0
    for mask in (real, real.long()):
        torch.testing.assert_close(model(ids, mask)[0], derived, rtol=0, atol=0)
    # A rank-4 mask constrains keys only: every position is computed, and the real ones agree.
    torch.testing.assert_close(model(ids, real[:, None, None, :])[0][real], derived[real], rtol=0, atol=1e-6)
    unmasked, _ = _model_without_pad(model)(ids)
    assert not torch.allclose(unmasked[0, :5], derived[0, :5])


def _model_without_pad(model: TransformerEncoder) -> TransformerEncoder:
    other = TransformerEncoder.from_config(EncoderConfig.from_dict({**model.config.to_dict(), "pad_id": None}))
    other.load_state_dict(model.state_dict())
    return other.eval()


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rotary", "none"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_padding_does_not_change_real_positions(position: str, norm_first: bool) -> None:
    model = _model(position=position, norm_first=norm_first)
    alone = torch.tensor([[5, 6, 7, 8, 9]])
    padded = _ids()  # row 0 is `alone` followed by three pads
    for output_attentions in (False, True):  # fused and reference paths
        expected, _ = model(alone, output_attentions=output_attentions)
        got, _ = model(padded, output_attentions=output_attentions)
        torch.testing.assert_close(got[0, :5], expected[0], rtol=0, atol=1e-5)


def test_head_mask_zeroes_a_head() -> None:
    model = _model()
    head_mask = torch.ones(LAYERS, HEADS)
    head_mask[0, 2] = 0.0
    x, attentions = model(_ids(), output_attentions=True, head_mask=head_mask)
    assert torch.equal(attentions["layer_1"][:, 2], torch.zeros(2, 8, 8))
    assert attentions["layer_2"][:, 2].abs().sum() > 0
    head_dim = E // HEADS
    with torch.no_grad():
        model.layers[0].self_attn.out_proj.weight[:, 2 * head_dim : 3 * head_dim] = 0.0
    torch.testing.assert_close(x, model(_ids())[0], rtol=0, atol=1e-5)


def test_head_mask_per_head_applies_to_every_layer() -> None:
    model = _model()
    _, attentions = model(_ids(), output_attentions=True, head_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]))
    for weights in attentions.values():
        assert torch.equal(weights[:, 1], torch.zeros(2, 8, 8))


@pytest.mark.parametrize("scale", [True, False])
def test_embedding_scaling(scale: bool) -> None:
    model = _model(position="none", dropout=0.0, scale_embeddings=scale)
    ids = _ids()
    factor = math.sqrt(E) if scale else 1.0
    torch.testing.assert_close(model.embed(ids), model.embedding.weight[ids] * factor)


def test_sinusoidal_positions_are_added_after_scaling() -> None:
    model = _model(dropout=0.0)
    ids = _ids()
    expected = model.embedding.weight[ids] * math.sqrt(E) + model.pos_encoding.pe[:, :8]
    torch.testing.assert_close(model.embed(ids), expected)


def test_article_initialisation() -> None:
    d_model = 64
    model = TransformerEncoder(4000, d_model=d_model, num_layers=1, num_heads=4, d_ff=128, pad_id=3)
    weight = model.embedding.weight.detach()
    assert torch.equal(weight[3], torch.zeros(d_model))  # the padding row
    others = torch.cat([weight[:3], weight[4:]])
    assert abs(float(others.std()) - d_model**-0.5) < 0.03 * d_model**-0.5
    assert abs(float(others.mean())) < 0.01 * d_model**-0.5
    # Matrices: Xavier-uniform, bounded by sqrt(6 / (fan_in + fan_out)).
    linear1 = model.layers[0].ffn.linear1.weight.detach()
    bound = math.sqrt(6 / (d_model + 128))
    assert float(linear1.abs().max()) <= bound
    assert abs(float(linear1.std()) - bound / math.sqrt(3)) < 0.05 * bound


def test_from_config_builds_the_same_architecture() -> None:
    model = _model(norm_first=True, position="learned", type_vocab_size=2, embedding_norm=True)
    twin = TransformerEncoder.from_config(model.config).eval()
    assert twin.config == model.config
    ours, theirs = model.state_dict(), twin.state_dict()
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert str(twin) == str(model)
    twin.load_state_dict(ours)
    torch.testing.assert_close(twin(_ids())[0], model(_ids())[0], rtol=0, atol=0)


def test_dropout_active_in_training_only() -> None:
    model = _model(dropout=0.3)
    model.train()
    assert not torch.allclose(model(_ids())[0], model(_ids())[0])
    model.eval()
    assert torch.equal(model(_ids())[0], model(_ids())[0])


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rotary", "none"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_options_train_with_finite_gradients(position: str, norm_first: bool) -> None:
    model = _model(position=position, norm_first=norm_first).train()
    x, attentions = model(_ids(), output_attentions=True)
    (x.square().mean() + sum(w.sum() for w in attentions.values())).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
        assert torch.isfinite(parameter.grad).all(), name
    assert (model.pos_encoding is None) == (position in ("rotary", "none"))
    assert (model.layers[0].self_attn.rotary is not None) == (position == "rotary")


def test_token_types_and_norm_options() -> None:
    model = _model(type_vocab_size=2, embedding_norm=True, final_norm=False)
    assert isinstance(model.embedding_norm, nn.LayerNorm) and model.layer_norm is None
    ids = _ids()
    zeros, _ = model(ids)
    torch.testing.assert_close(model(ids, token_type_ids=torch.zeros_like(ids))[0], zeros)
    assert not torch.allclose(model(ids, token_type_ids=torch.ones_like(ids))[0], zeros)


def test_attention_masks_of_rank_3_and_4() -> None:
    model = _model(pad_id=None)
    ids = _ids()
    causal = causal_mask(8)
    x3, _ = model(ids, causal.expand(2, 8, 8))
    x4, _ = model(ids, causal[None, None])
    torch.testing.assert_close(x3, x4, rtol=0, atol=0)
    assert not torch.allclose(x3, model(ids)[0])


def test_device_and_dtype() -> None:
    model = _model(dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert model(_ids())[0].dtype == torch.float64
