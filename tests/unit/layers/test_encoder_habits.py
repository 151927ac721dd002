"""The calls HuggingFace and PyTorch users already type, on the encoder and task heads."""

from __future__ import annotations

import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.models import EncoderClassifier, EncoderForMaskedLM
from attnlab.outputs import LayerAttentions

VOCAB, E, LAYERS, HEADS, FF = 50, 32, 3, 4, 64


def _encoder(**options) -> TransformerEncoder:
    torch.manual_seed(0)
    return TransformerEncoder(VOCAB, E, LAYERS, HEADS, FF, pad_id=0, max_len=16, **options).eval()


def _batch():
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    return ids, (ids != 0).long()


@pytest.mark.parametrize("skip_padding", [True, False])
def test_attention_mask_keyword_in_any_dtype_equals_the_mask(skip_padding) -> None:
    model = _encoder(skip_padding=skip_padding)
    ids, real = _batch()
    expected = model(ids, real.bool()).last_hidden_state
    for mask in (real, real.bool(), real.float(), real.half()):
        torch.testing.assert_close(model(ids, attention_mask=mask).last_hidden_state, expected, rtol=0, atol=0)
        torch.testing.assert_close(model(ids, mask).last_hidden_state, expected, rtol=0, atol=0)


def test_a_float_0_1_mask_is_never_added_to_the_scores() -> None:
    """The silent case: a float 0/1 mask read as additive gives padding most of the attention."""
    model = _encoder(skip_padding=False)
    ids, real = _batch()
    _, attentions = model(ids, attention_mask=real.float(), output_attentions=True)
    padding_keys = ~real.bool()[:, None, None, :]  # [B, 1, 1, T]
    for layer in attentions:
        assert not layer.masked_select(padding_keys).any()


def test_additive_masks_and_two_masks_are_refused_with_the_way_out() -> None:
    model = _encoder()
    ids, real = _batch()
    additive = torch.zeros(2, 6).masked_fill(real == 0, float("-inf"))
    with pytest.raises(TypeError, match="holding -inf besides 0 and 1"):
        model(ids, attention_mask=additive)
    with pytest.raises(ValueError, match="pass one padding mask, got mask and attention_mask"):
        model(ids, real, attention_mask=real)


def test_torch_padding_mask_is_read_with_torch_polarity() -> None:
    model = _encoder()
    ids, real = _batch()
    expected = model(ids, attention_mask=real).last_hidden_state
    got = model(ids, src_key_padding_mask=real == 0).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(TypeError, match="src_key_padding_mask follows torch.nn"):
        model(ids, src_key_padding_mask=real)


@pytest.mark.parametrize("skip_padding", [True, False])
def test_outputs_index_key_attribute_and_unpack_like_hf_and_the_article(skip_padding) -> None:
    model = _encoder(skip_padding=skip_padding)
    ids, real = _batch()
    out = model(ids, attention_mask=real, output_attentions=True, output_hidden_states=True)
    assert out[0] is out.last_hidden_state is out["last_hidden_state"]
    assert isinstance(out.attentions, LayerAttentions) and len(out.attentions) == LAYERS
    assert out.attentions[0] is out.attentions["layer_1"] and out.attentions[-1] is out.attentions["layer_3"]
    assert torch.stack(tuple(out.attentions)).shape == (LAYERS, 2, HEADS, 6, 6)
    assert list(out.attentions.keys()) == ["layer_1", "layer_2", "layer_3"]
    assert "layer_2" in out.attentions and "layer_4" not in out.attentions
    with pytest.raises(KeyError, match="no layer named 'layer_4'"):
        out.attentions["layer_4"]
    assert out.to_tuple() == (out.last_hidden_state, out.hidden_states, out.attentions)
    assert len(out.hidden_states) == LAYERS + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    # the article's pair: attentions are always the second item, None unless asked for
    x, attentions = model(ids)
    assert attentions is None
    torch.testing.assert_close(x, out.last_hidden_state, rtol=0, atol=1e-5)
    with pytest.raises(KeyError, match="'attentions' is not set"):
        model(ids)["attentions"]
    assert isinstance(model(ids, return_dict=False), tuple)


def test_hidden_states_are_each_layers_output() -> None:
    model = _encoder(skip_padding=False)
    ids, real = _batch()
    out = model(ids, attention_mask=real, output_hidden_states=True)
    x = out.hidden_states[0]
    for index, layer in enumerate(model.layers):
        x, _ = layer(x, real.bool()[:, None, None, :])
        expected = model.layer_norm(x) if index == LAYERS - 1 and model.layer_norm is not None else x
        torch.testing.assert_close(out.hidden_states[index + 1], expected, rtol=0, atol=1e-6)


def test_task_heads_take_hf_keywords_and_order_their_outputs_like_hf() -> None:
    encoder = _encoder()
    ids, real = _batch()
    classifier = EncoderClassifier(encoder, 3).eval()
    labels = torch.tensor([0, 2])
    out = classifier(ids, attention_mask=real.float(), labels=labels, output_hidden_states=True)
    assert out[0] is out.loss and out[1] is out.logits and out["logits"] is out.logits
    loss, logits, hidden_states, last = out  # loss, logits, hidden_states, last_hidden_state
    assert hidden_states is out.hidden_states and last is out.last_hidden_state
    torch.testing.assert_close(classifier(**{"input_ids": ids, "attention_mask": real}).logits, logits)
    assert classifier(ids)[0] is not None and classifier(ids).loss is None
    masked_lm = EncoderForMaskedLM(encoder).eval()
    assert masked_lm(ids, attention_mask=real).logits.shape == (2, 6, VOCAB)


def test_sparse_attention_layers_take_the_same_padding_keywords() -> None:
    model = _encoder(attention="sparse", block_size=4, window=1)
    ids, real = _batch()
    expected = model(ids, real.bool()).last_hidden_state
    got = model(ids, attention_mask=real.float()).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    layer = model.layers[0]
    x = torch.randn(2, 6, E)
    torch.testing.assert_close(layer(x, attention_mask=real)[0], layer(x, src_key_padding_mask=real == 0)[0])
