"""The encoder's sparse-attention option."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab import EncoderConfig, SparseAttention, TransformerEncoder, TransformerEncoderLayer
from attnlab.attention.sparse.block_sparse import BlockSparseWeights


def small_encoder(**options) -> TransformerEncoder:
    torch.manual_seed(0)
    settings = dict(d_model=32, num_layers=2, num_heads=4, d_ff=64, dropout=0.0, max_len=256, pad_id=0)
    settings.update(options)
    return TransformerEncoder(100, **settings)


def test_sparse_encoder_uses_sparse_attention_in_every_layer() -> None:
    model = small_encoder(attention="sparse", block_size=8, window=1, global_tokens=(0,))
    assert all(isinstance(layer.self_attn, SparseAttention) for layer in model.layers)
    attn = model.layers[0].self_attn
    assert (attn.block_size, attn.window, attn.global_tokens, attn.global_summary) == (8, 1, (0,), True)


def test_sparse_encoder_trains_on_padded_input_of_any_length() -> None:
    model = small_encoder(attention="sparse", block_size=8, window=1, global_tokens=(0,)).train()
    ids = torch.randint(1, 100, (2, 43))
    ids[1, 30:] = 0
    hidden, attentions = model(ids)
    assert hidden.shape == (2, 43, 32) and attentions is None
    hidden.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_padding_does_not_reach_real_tokens() -> None:
    model = small_encoder(attention="sparse", block_size=4, window=1).eval()
    ids = torch.randint(1, 100, (1, 20))
    longer = torch.cat([ids, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(longer).last_hidden_state[:, :20], model(ids).last_hidden_state)


def test_output_attentions_give_drawable_dense_weights() -> None:
    model = small_encoder(attention="sparse", block_size=4, window=0, global_summary=False).eval()
    ids = torch.randint(1, 100, (2, 10))
    ids[0, 7:] = 0
    _, attentions = model(ids, output_attentions=True)
    weights = attentions["layer_2"]
    assert weights.shape == (2, 4, 10, 10)
    assert torch.equal(weights[..., 7:][0], torch.zeros_like(weights[..., 7:][0]))  # padding keys
    assert torch.equal(weights[1, :, :4, 4:], torch.zeros(4, 4, 6))  # outside query block 0
    expected = torch.ones(2, 4, 10)
    expected[0, :, 8:] = 0.0  # block [8, 12) of sequence 0 is all padding: no key, zero row
    torch.testing.assert_close(weights.sum(-1), expected)


def test_layer_accepts_a_block_layout_module() -> None:
    attn = SparseAttention(16, 2, 4, dropout=0.0, window=1, weights_layout="blocks")
    layer = TransformerEncoderLayer(16, 2, 32, 0.0, self_attention=attn)
    _, weights = layer(torch.randn(1, 9, 16), need_weights=True)
    assert isinstance(weights, BlockSparseWeights) and weights.to_dense().shape == (1, 2, 9, 9)


def test_rotary_positions_reach_the_sparse_attention() -> None:
    model = small_encoder(attention="sparse", block_size=8, position="rotary")
    assert model.pos_encoding is None and model.layers[0].self_attn.rotary is not None


def test_config_round_trip_through_json() -> None:
    config = EncoderConfig(100, d_model=32, num_heads=4, attention="sparse", block_size=16, window=2,
                           global_summary=False, global_tokens=[0, 5])
    assert config.global_tokens == (0, 5)
    again = EncoderConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    model = TransformerEncoder.from_config(again)
    assert model.layers[0].self_attn.window == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"attention": "sparse", "block_size": 0}, "block_size"),
        ({"attention": "sparse", "window": -1}, "window"),
        ({"attention": "sparse", "global_tokens": (-2,)}, "global_tokens"),
        ({"attention": "sparse", "global_tokens": "0"}, "global_tokens"),
        ({"block_size": 64}, "only apply to attention='sparse'"),
        ({"attention": "longformer"}, "attention must be one of"),
    ],
)
def test_config_validation(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EncoderConfig(100, d_model=32, num_heads=4, **options)
