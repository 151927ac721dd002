"""The inspection protocol both doors offer, against independent references.

attnlab's own statistics mode (each layer's map reduced as it is made) against the
statistics of the whole maps; the streaming rollout against :func:`attention_rollout`;
a transformers BERT and attnlab's own BERT of the same weights giving one analyzer
result through the two doors; ``attnlab.load`` opening a directory only transformers
knows, as the command line does.
"""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab import TransformerEncoder
from attnlab.inspect import AttentionAnalyzer, attention_rollout, capture_attention, inspectable
from attnlab.inspect.compute.inspectable import Inspectable, NotOffered, require
from attnlab.inspect.compute.own_model import OwnModel
from attnlab.inspect.compute.statistics import HeadStatistics
from attnlab.layers.decoder_config import DecoderConfig
from attnlab.models.classifier import EncoderClassifier
from attnlab.models.decoder import DecoderForCausalLM

IDS = torch.tensor([[2, 5, 6, 7, 8, 3, 0, 0], [2, 9, 10, 11, 12, 13, 14, 3]])
MASK = IDS != 0


def _classifier() -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=3, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 2).eval()


def test_own_models_offer_the_protocol_with_named_sites_and_stated_capabilities():
    view = inspectable(_classifier())
    assert isinstance(view, OwnModel) and isinstance(view, Inspectable) and view.kind == "encoder"
    assert [site.name for site in view.attention_sites()] == ["layer_1", "layer_2", "layer_3"]
    assert all(site.heads == 4 and not site.causal and not site.cross for site in view.attention_sites())
    assert view.unsupported("record") is None and view.unsupported("intervene") is None
    with pytest.raises(NotOffered, match="^the logit lens: EncoderClassifier has no final norm"):
        require(view, "readout", "the logit lens")
    decoder = inspectable(DecoderForCausalLM(DecoderConfig(vocab_size=30, d_model=16, num_layers=2, num_heads=4,
                                                           d_ff=32, num_kv_heads=2, eos_id=3)))
    assert decoder.kind == "decoder" and all(site.causal for site in decoder.attention_sites())
    assert decoder.special_ids == {"pad": [], "bos": [], "eos": [3]} and view.special_ids["pad"] == [0]
    assert decoder.unsupported("generate") is None and decoder.unsupported("readout") is None
    with pytest.raises(TypeError, match="expected a model"):
        inspectable("not a model")


def test_own_statistics_mode_equals_the_statistics_of_the_whole_maps():
    model = _classifier()
    view = inspectable(model)
    with torch.no_grad(), view.statistics(token_groups={"cls": [2]}) as recorder:
        model(IDS, mask=MASK)
    with torch.no_grad(), capture_attention(model) as captured:
        model(IDS, mask=MASK)
    expected = HeadStatistics(token_groups={"cls": [2]})
    for name, weights in captured.attentions.items():
        expected.update(name, weights, MASK, MASK, input_ids=IDS)
    got, want = recorder.means(), expected.means()
    assert list(got) == list(want)
    for layer in want:
        for name, values in want[layer].items():
            assert got[layer][name] == pytest.approx(values, abs=1e-6, nan_ok=True), (layer, name)
    assert recorder.row_counts() == expected.row_counts() == {name: [int(MASK.sum())] * 4 for name in want}


def test_the_streaming_rollout_equals_attention_rollout_of_the_whole_maps():
    model = _classifier()
    with torch.no_grad(), capture_attention(model) as captured:
        model(IDS, mask=MASK)
    rollout = attention_rollout(captured.attentions, MASK)  # [L, B, T, T]
    p = rollout * MASK[None, :, None, :]
    p = p / p.sum(-1, keepdim=True)
    entropy = -torch.special.xlogy(p, p).sum(-1)  # [L, B, T]
    own = torch.diagonal(p, dim1=-2, dim2=-1)
    stats = AttentionAnalyzer(model).analyze_attention_distribution([{"input_ids": IDS, "mask": MASK}])
    for index, layer in enumerate(captured.attentions):
        assert stats.rollout[layer]["entropy"] == pytest.approx(float(entropy[index][MASK].mean()), rel=1e-5)
        assert stats.rollout[layer]["self"] == pytest.approx(float(own[index][MASK].mean()), rel=1e-5)


transformers = pytest.importorskip("transformers", reason="the second door needs the hf extra")


def _bert_dir(tmp_path):
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     pad_token_id=0, initializer_range=0.3)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(tmp_path / "bert")
    return tmp_path / "bert"


def test_the_analyzer_gives_one_result_through_both_doors(tmp_path):
    """The same BERT weights: attnlab's own BERT (attnlab.load) and transformers' (served by
    attnlab's attention function, statistics block by block, rollout followed layer by layer)."""
    from attnlab.hf.opening import TransformersModel

    directory = _bert_dir(tmp_path)
    ours = attnlab.load(directory, tokenizer=False).model
    served = TransformersModel(transformers.BertForSequenceClassification.from_pretrained(directory).eval())
    batch = [{"input_ids": IDS, "mask": MASK}]
    a = AttentionAnalyzer(ours).analyze_attention_distribution(batch, head_mask={"layer_2": [1]})
    b = AttentionAnalyzer(served).analyze_attention_distribution(batch, head_mask={"layer_2": [1]})
    assert a.layers == b.layers == ["layer_1", "layer_2"] and a.rows == b.rows
    for name in a.keys():
        assert b.matrix(name) == pytest.approx(a.matrix(name), abs=1e-5, nan_ok=True), name
    for layer in a.rollout:
        assert b.rollout[layer] == pytest.approx(a.rollout[layer], rel=1e-5)
    assert a["entropy"][1][1] is None, "a switched-off head has no statistics"


def test_attnlab_load_opens_a_directory_only_transformers_knows_as_the_command_line_does(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    config = transformers.Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      max_position_embeddings=64, eos_token_id=3)
    reference = transformers.Qwen3ForCausalLM(config).eval()
    reference.save_pretrained(tmp_path / "qwen3")
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, **{f"w{i}": i for i in range(1, 40)}}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "qwen3" / "tokenizer.json"))

    model, tokenizer, loaded_config = attnlab.load(tmp_path / "qwen3")  # UnsupportedCheckpointError before
    assert type(model).__name__ == "TransformersModel" and model.kind == "decoder"
    assert loaded_config.model_type == "qwen3" and model.special_ids["eos"] == [3]
    assert model.label_names is None, "a language model's default id2label (LABEL_0, LABEL_1) names no classes"
    assert tokenizer.padding_side == "left" and tokenizer.model_max_length == 64
    batch = tokenizer(["w1 w2 w3", "w4"], padding=True, return_tensors="pt")
    with torch.no_grad():
        got = model(batch["input_ids"], mask=batch["attention_mask"].bool()).logits
        want = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)
    with torch.no_grad():  # called as attnlab's encoders are called: the tokenizer's output as keywords
        assert torch.allclose(model(**batch).logits[real], want[real], atol=1e-5)
    assert next(attnlab.load(tmp_path / "qwen3", dtype="bfloat16").model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="^dropout=0.1: options of the encoders attnlab re-implements"):
        attnlab.load(tmp_path / "qwen3", dropout=0.1)
    with pytest.raises(ValueError, match="^dtype must be one of"):
        attnlab.load(tmp_path / "qwen3", dtype="fp8")
    assert json.loads((tmp_path / "qwen3" / "config.json").read_text())["model_type"] == "qwen3"


def test_analyze_importance_on_a_language_model_needs_no_labels(tmp_path):
    """Head importance of a decoder through the command's workflow: the loss of predicting the
    text itself (it asked for a label column, and for the config's LABEL_0/LABEL_1, before)."""
    from attnlab.hf.opening import TransformersModel
    from attnlab.workflows.analyze_texts import analyze_rows

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = TransformersModel(transformers.LlamaForCausalLM(config).eval())

    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    from attnlab.data.tokenizer import Tokenizer

    backend = Backend(models.WordLevel({"[UNK]": 0, **{f"w{i}": i for i in range(1, 30)}}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokens = Tokenizer(backend)
    stats = analyze_rows(model, tokens, [("w1 w2 w3 w4", None), ("w5 w6 w7", None)], importance=True)
    importance = torch.tensor(stats.head_importance)
    assert importance.shape == (2, 4) and bool((importance > 0).all())


def test_layer_patching_gives_one_result_through_both_doors(tmp_path):
    """Patching a whole layer's output (the residual stream it hands on): attnlab's own BERT
    and transformers' BERT of the same weights (refused on a transformers model before)."""
    from attnlab.hf.opening import TransformersModel
    from attnlab.inspect import layer_patching_sweep, patch_layers

    directory = _bert_dir(tmp_path)
    ours = attnlab.load(directory, tokenizer=False).model
    served = TransformersModel(transformers.BertForSequenceClassification.from_pretrained(directory).eval())
    assert [path for path, _ in inspectable(served).blocks()] == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
    source, target = IDS[1:, :6], IDS[1:, 1:7]
    a, b = patch_layers(ours, source, target, [0], label=1), patch_layers(served, source, target, [0], label=1)
    for field in ("clean", "source", "patched"):
        assert torch.allclose(getattr(a, field), getattr(b, field), atol=1e-5), field
    assert not torch.allclose(b.patched, b.clean), "the patched layer must matter"
    sweep = layer_patching_sweep(served, source, target, label=1, recovered=True)
    assert torch.allclose(sweep[-1], torch.ones(()), atol=1e-4), "the last layer patched is the source run"
