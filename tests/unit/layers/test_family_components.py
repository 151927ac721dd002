"""The components pretrained families are built from, each on its own.

Position scheme (PaddingOffsetPositionalEmbedding), score bias (RelativePositionBias),
local attention (MultiHeadAttention(window=), fused against reference, padded and
packed), gated feed-forward net (GatedFFN), the classifier's DensePooler, and the
encoder's component keywords.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import EncoderClassifier, MultiHeadAttention, TransformerEncoder
from attnlab.attention.masks import sliding_window_mask
from attnlab.attention.position_bias import RelativePositionBias, relative_position_bucket
from attnlab.layers import GatedFFN
from attnlab.layers.positional import PaddingOffsetPositionalEmbedding
from attnlab.checkpoints import build_model, model_config


def test_padding_offset_positions_count_real_tokens_after_the_pad_id():
    positions = PaddingOffsetPositionalEmbedding(4, max_len=10, pad_id=1)
    input_ids = torch.tensor([[5, 6, 7, 1, 1], [1, 5, 6, 1, 7]])
    assert positions.position_ids(input_ids).tolist() == [[2, 3, 4, 1, 1], [1, 2, 3, 1, 4]]
    x = torch.zeros(2, 5, 4)
    expected = positions.embedding(positions.position_ids(input_ids))
    assert torch.equal(positions(x, input_ids=input_ids), expected)
    with pytest.raises(ValueError, match="exceeds the 8 positions"):
        positions(torch.zeros(1, 9, 4), input_ids=torch.full((1, 9), 5))
    with pytest.raises(ValueError, match="pad_id"):
        PaddingOffsetPositionalEmbedding(4, max_len=10, pad_id=9)


def test_relative_position_buckets_are_exact_near_and_logarithmic_far():
    offsets = torch.tensor([0, 1, 2, 7, 8, 100, 1000, -1, -7, -1000])
    buckets = relative_position_bucket(offsets, num_buckets=32, max_distance=128)
    # keys after the query sit in the upper half; the first 8 distances have a bucket each
    assert buckets.tolist()[:4] == [0, 17, 18, 23] and buckets[7].item() == 1 and buckets[8].item() == 7
    assert buckets[4] == 24 and buckets[6] == 31 and buckets[9] == 15  # far offsets share the last bucket
    bias = RelativePositionBias(num_heads=3)(5, 6)
    assert bias.shape == (1, 3, 5, 6)


def test_sliding_window_mask_is_a_band():
    mask = sliding_window_mask(4, window=1)
    assert mask.int().tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(4, window=-1)


@pytest.mark.parametrize("rotary", [False, True])
def test_local_attention_fused_matches_reference_padded_and_packed(rotary):
    torch.manual_seed(0)
    encoder = TransformerEncoder(
        50,
        d_model=32,
        num_layers=2,
        num_heads=4,
        d_ff=48,
        dropout=0.0,
        pad_id=0,
        position="rotary" if rotary else "learned",
        layer_factory=lambda index: _local_layer(index, rotary),
    ).eval()
    input_ids = torch.randint(1, 50, (3, 12))
    input_ids[1, 7:] = 0
    mask = input_ids != 0
    with torch.no_grad():
        fused = encoder(input_ids).last_hidden_state
        reference = encoder(input_ids, output_attentions=True)
        encoder.config.skip_padding = False
        every_position = encoder(input_ids, output_attentions=True)
    torch.testing.assert_close(fused[mask], reference.last_hidden_state[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(every_position.last_hidden_state[mask], fused[mask], atol=1e-5, rtol=0)
    band = sliding_window_mask(12, window=2)
    for weights in (reference.attentions[0], every_position.attentions[0]):
        assert not weights[..., ~band].any(), "keys outside the window got attention"


def _local_layer(index: int, rotary: bool):
    from attnlab import TransformerEncoderLayer

    attention = MultiHeadAttention(32, 4, 0.0, rotary=rotary, window=2)
    return TransformerEncoderLayer(32, 4, 48, 0.0, self_attention=attention)


def test_gated_ffn_is_activation_of_one_half_times_the_other():
    torch.manual_seed(0)
    ffn = GatedFFN(8, 6, dropout=0.0, bias=False)
    x = torch.randn(2, 3, 8)
    value, gate = (x @ ffn.linear1.weight.T).chunk(2, dim=-1)
    torch.testing.assert_close(ffn(x), (F.gelu(value) * gate) @ ffn.linear2.weight.T)
    assert ffn.linear1.bias is None and ffn.linear1.weight.shape == (12, 8)


def test_classifier_pooler_settings_survive_the_attnlab_checkpoint_config():
    encoder = TransformerEncoder(30, d_model=16, num_layers=1, num_heads=2, d_ff=32, pad_id=0)
    pooler = {"activation": "gelu", "bias": False, "norm_eps": 1e-5, "norm_bias": False}
    model = EncoderClassifier(encoder, 3, pooling="first", pooler=pooler).eval()
    assert model.pooler.dense.bias is None and model.pooler.norm.bias is None
    rebuilt = build_model(model_config(model)).eval()
    rebuilt.load_state_dict(model.state_dict())
    input_ids = torch.tensor([[3, 4, 5, 0]])
    with torch.no_grad():
        assert torch.equal(rebuilt(input_ids).logits, model(input_ids).logits)
    with pytest.raises(ValueError, match="pooler"):
        EncoderClassifier(encoder, 3, pooler={"activation": "tanh", "width": 3})
    with pytest.raises(ValueError, match="activation"):
        EncoderClassifier(encoder, 3, pooler={"activation": "sigmoid"})


def test_factorised_embeddings_are_projected_to_the_model_width():
    encoder = TransformerEncoder(
        30,
        d_model=16,
        num_layers=1,
        num_heads=2,
        d_ff=32,
        embedding_dim=8,
        position="learned",
        max_len=10,
        type_vocab_size=2,
        embedding_norm=True,
    )
    assert encoder.embedding.weight.shape == (30, 8)
    assert encoder.pos_encoding.embedding.weight.shape == (10, 8)
    assert encoder.embedding_projection.weight.shape == (16, 8)
    assert encoder(torch.tensor([[3, 4, 5]])).last_hidden_state.shape == (1, 3, 16)


def test_a_score_bias_reaches_every_layer():
    torch.manual_seed(0)
    bias = RelativePositionBias(num_heads=2)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=2, d_ff=32, score_bias=bias).eval()
    input_ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        with_bias = encoder(input_ids, output_attentions=True).attentions
        bias.embedding.weight.zero_()
        without = encoder(input_ids, output_attentions=True).attentions
    assert all(not torch.allclose(a, b) for a, b in zip(with_bias, without))


def test_disentangled_attention_fused_matches_reference_and_stores_its_table_once():
    from attnlab.checkpoints.encoders.deberta_v2 import DEBERTA_V2

    values = {
        "model_type": "deberta-v2",
        "vocab_size": 40,
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 24,
        "relative_attention": True,
        "position_biased_input": False,
        "pos_att_type": "p2c|c2p",
        "share_att_key": True,
        "norm_rel_ebd": "layer_norm",
        "position_buckets": 4,
        "max_relative_positions": 16,
        "type_vocab_size": 0,
        "pad_token_id": 0,
    }
    torch.manual_seed(0)
    encoder = DEBERTA_V2.build(values, DEBERTA_V2.config_from_hf(values, "config.json")).eval()
    tables = [name for name in encoder.state_dict() if ".positions." in name]
    assert tables and all(name.startswith("layers.0.") for name in tables)
    assert encoder.layers[1].self_attn.table is encoder.layers[0].self_attn.table
    input_ids = torch.randint(1, 40, (2, 11))
    input_ids[1, 6:] = 0
    mask = input_ids != 0
    with torch.no_grad():
        fused = encoder(input_ids).last_hidden_state
        reference = encoder(input_ids, output_attentions=True).last_hidden_state
    torch.testing.assert_close(fused[mask], reference[mask], atol=1e-5, rtol=0)
