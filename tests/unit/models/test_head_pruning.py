"""Head pruning that removes heads: same numbers as masking them, smaller projections, saved and loaded."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab import EncoderClassifier, MultiHeadAttention, TransformerEncoder, prune_heads
from attnlab.inspect import mask_heads
from attnlab.checkpoints.encoders.loading import bert_style_config, from_pretrained, save_pretrained

IDS = torch.tensor([[2, 5, 6, 7, 3, 0, 0], [2, 9, 3, 0, 0, 0, 0]])


def _classifier(seed: int = 0, **options) -> EncoderClassifier:
    torch.manual_seed(seed)
    encoder = TransformerEncoder(20, d_model=16, num_layers=3, num_heads=4, d_ff=32, pad_id=0, **options)
    return EncoderClassifier(encoder, 2).eval()


@pytest.mark.parametrize("packed", [True, False])
def test_attention_module_prunes_to_the_masked_result(packed):
    torch.manual_seed(0)
    options = {} if packed else {"kdim": 12, "vdim": 10}
    mha = MultiHeadAttention(16, 4, dropout=0.0, **options).eval()
    q = torch.randn(2, 5, 16)
    k, v = (q, q) if packed else (torch.randn(2, 6, 12), torch.randn(2, 6, 10))
    expected, _ = mha(q, k, v, head_mask=torch.tensor([1.0, 0.0, 1.0, 0.0]))
    mha.prune_heads([1, 3])
    got, weights = mha(q, k, v, need_weights=True)
    assert mha.num_heads == 2 and mha.inner_dim == 8 and mha.out_proj.weight.shape == (16, 8)
    assert weights.shape[1] == 2
    assert torch.allclose(got, expected, atol=1e-6)


def test_a_head_dim_other_than_d_model_over_heads():
    mha = MultiHeadAttention(16, 3, dropout=0.0, head_dim=8)
    out, _ = mha(torch.randn(1, 4, 16), torch.randn(1, 4, 16), torch.randn(1, 4, 16))
    assert out.shape == (1, 4, 16) and mha.in_proj_weight.shape == (72, 16) and "head_dim=8" in repr(mha)


def test_pruned_model_equals_the_masked_model_with_and_without_padding_skipping():
    model = _classifier()
    with torch.no_grad(), mask_heads(model, {"layer_1": [0, 2], "layer_3": [1]}):
        expected = model(IDS).logits
    prune_heads(model, {"layer_1": [0, 2], 2: [1]})
    assert [layer.self_attn.num_heads for layer in model.encoder.layers] == [2, 4, 3]
    assert model.encoder.config.pruned_heads == {"layer_1": [0, 2], "layer_3": [1]}
    with torch.no_grad():
        assert torch.allclose(model(IDS).logits, expected, atol=1e-5)
        model.encoder.config.skip_padding = False
        assert torch.allclose(model(IDS).logits, expected, atol=1e-5)


def test_pruning_again_counts_heads_as_the_unpruned_model_did():
    model = _classifier()
    with torch.no_grad(), mask_heads(model, {"layer_2": [1, 3]}):
        expected = model(IDS).logits
    prune_heads(model, {"layer_2": [1]})
    prune_heads(model, {"layer_2": [3, 1]})  # head 3 of the original four; 1 is already gone
    assert model.encoder.config.pruned_heads == {"layer_2": [1, 3]}
    with torch.no_grad():
        assert torch.allclose(model(IDS).logits, expected, atol=1e-5)


def test_pruned_model_saves_and_loads(tmp_path):
    model = prune_heads(_classifier(), {"layer_1": [3], "layer_2": [0, 1]})
    model.save_pretrained(tmp_path / "pruned")
    loaded = attnlab.load(tmp_path / "pruned").model
    assert [layer.self_attn.num_heads for layer in loaded.encoder.layers] == [3, 2, 4]
    with torch.no_grad():
        assert torch.allclose(loaded(IDS).logits, model(IDS).logits, atol=1e-6)


def test_pruned_encoder_exports_in_the_bert_layout_with_zero_heads(tmp_path):
    torch.manual_seed(0)
    encoder = TransformerEncoder.from_config(bert_style_config(20, 16, 2, 4, 32, pad_id=0)).eval()
    prune_heads(encoder, {"layer_2": [0, 3]})
    save_pretrained(encoder, tmp_path / "bert")
    exported = from_pretrained(tmp_path / "bert").eval()
    assert exported.layers[1].self_attn.num_heads == 4  # the BERT layout: every head, two of them zero
    with torch.no_grad():
        assert torch.allclose(exported(IDS).last_hidden_state, encoder(IDS).last_hidden_state, atol=1e-5)
    transformers = pytest.importorskip("transformers")
    bert = transformers.BertModel.from_pretrained(tmp_path / "bert").eval()
    with torch.no_grad():
        theirs = bert(IDS, attention_mask=(IDS != 0).long()).last_hidden_state
    real = IDS != 0
    assert torch.allclose(theirs[real], encoder(IDS).last_hidden_state[real], atol=1e-4)


def test_refusals():
    model = _classifier()
    with pytest.raises(ValueError, match="all 4 heads"):
        prune_heads(model, {"layer_1": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match="unknown layer 'layer_7'"):
        prune_heads(model, {"layer_7": [0]})
    with pytest.raises(ValueError, match="0..3"):
        prune_heads(model, {"layer_1": [4]})
    with pytest.raises(TypeError, match="TransformerEncoder"):
        prune_heads(torch.nn.Linear(2, 2), {"layer_1": [0]})
    assert model.encoder.config.pruned_heads == {}  # nothing half-done
    with pytest.raises(ValueError, match="keep at least one"):
        attnlab.EncoderConfig(20, 16, 1, 2, 32, pruned_heads={"layer_1": [0, 1]})
