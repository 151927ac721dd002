"""attnlab on every supported HuggingFace family against ``transformers`` (eager attention).

Each case builds a tiny randomly initialised HuggingFace model at test time
(config -> model -> ``save_pretrained``), opens the directory with
:func:`attnlab.from_pretrained` and compares, on a padded batch, the last hidden state
and every layer's per-head weights (real positions and real query rows; attnlab's
padding positions are zeros when it skips padding), the classification logits, and the
round trip through :func:`attnlab.checkpoints.encoders.loading.save_pretrained`.
"""

from __future__ import annotations

import pytest
import torch

from attnlab import EncoderClassifier, EncoderForMaskedLM, TransformerEncoder, capture_attention, mask_heads
from attnlab.inspect.compute.lrp import attention_relevance
from attnlab.checkpoints.encoders.loading import from_pretrained, save_pretrained

transformers = pytest.importorskip(
    "transformers", reason="parity with HuggingFace needs transformers (pip install -e '.[dev]')"
)

TOLERANCE = 1e-5
VOCAB = 99
SMALL = {
    "vocab_size": VOCAB,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
}


def _bert_like(**extra):
    return {**SMALL, "hidden_size": 32, "num_hidden_layers": 3, **extra}


# family -> (config class, its keyword arguments, base class, classifier class)
CASES = {
    "bert": ("BertConfig", _bert_like(pad_token_id=0), "BertModel", "BertForSequenceClassification"),
    "roberta": (
        "RobertaConfig",
        _bert_like(pad_token_id=1, type_vocab_size=1),
        "RobertaModel",
        "RobertaForSequenceClassification",
    ),
    "xlm-roberta": (
        "XLMRobertaConfig",
        _bert_like(pad_token_id=1, type_vocab_size=1),
        "XLMRobertaModel",
        "XLMRobertaForSequenceClassification",
    ),
    "distilbert": (
        "DistilBertConfig",
        {
            "vocab_size": VOCAB,
            "dim": 32,
            "n_layers": 3,
            "n_heads": 4,
            "hidden_dim": 37,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
        },
        "DistilBertModel",
        "DistilBertForSequenceClassification",
    ),
    "electra": (
        "ElectraConfig",
        _bert_like(embedding_size=16, pad_token_id=0),
        "ElectraModel",
        "ElectraForSequenceClassification",
    ),
    "albert": (
        "AlbertConfig",
        _bert_like(embedding_size=16, pad_token_id=0, num_hidden_layers=4, num_hidden_groups=2),
        "AlbertModel",
        "AlbertForSequenceClassification",
    ),
    "mpnet": ("MPNetConfig", _bert_like(pad_token_id=1), "MPNetModel", "MPNetForSequenceClassification"),
    # 4 layers: global, local, global, local; a window of 2 keys on each side is narrower than the batch.
    "modernbert": (
        "ModernBertConfig",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 37,
            "max_position_embeddings": 64,
            "pad_token_id": 0,
            "local_attention": 4,
            "global_attn_every_n_layers": 2,
            "bos_token_id": 2,
            "eos_token_id": 2,
            "cls_token_id": 2,
            "sep_token_id": 2,
        },
        "ModernBertModel",
        "ModernBertForSequenceClassification",
    ),
    # v3's settings; 4 buckets up to 16 positions, so a 9-token batch reaches the logarithmic ones.
    "deberta-v2": (
        "DebertaV2Config",
        _bert_like(
            pad_token_id=0,
            type_vocab_size=0,
            relative_attention=True,
            position_biased_input=False,
            pos_att_type=["p2c", "c2p"],
            share_att_key=True,
            norm_rel_ebd="layer_norm",
            position_buckets=4,
            max_relative_positions=16,
        ),
        "DebertaV2Model",
        "DebertaV2ForSequenceClassification",
    ),
    # v2's older settings: own position projections, absolute positions too, no table norm, one term.
    "deberta-v2-unshared": (
        "DebertaV2Config",
        _bert_like(pad_token_id=0, relative_attention=True, pos_att_type="c2p", share_att_key=False),
        "DebertaV2Model",
        "DebertaV2ForSequenceClassification",
    ),
}
LABELS = {0: "negative", 1: "neutral", 2: "positive"}


def _perturbed(model):
    """HF's init (std 0.02) makes attention nearly uniform; spread the weights so the
    comparison has something to compare."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()


def _hf_dir(family: str, tmp_path, *, classifier: bool, masked_lm: bool = False):
    config_class, options, base, head = CASES[family]
    kwargs = dict(options)
    if classifier:
        kwargs.update(id2label=LABELS, label2id={name: index for index, name in LABELS.items()})
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(0)
    model_class = head if classifier else base.replace("Model", "ForMaskedLM") if masked_lm else base
    model = _perturbed(getattr(transformers, model_class)(config))
    directory = tmp_path / f"{family}-{model_class}"
    model.save_pretrained(directory)
    return directory


def _hf(directory, *, classifier: bool, implementation: str = "eager"):
    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModel
    return auto.from_pretrained(str(directory), attn_implementation=implementation).eval()


def _batch(pad_id: int):
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(3, VOCAB, (3, 9), generator=generator)
    input_ids[0, 6:] = pad_id
    input_ids[2, 3:] = pad_id
    return input_ids, input_ids != pad_id


def _pad_id(family: str) -> int:
    return CASES[family][1]["pad_token_id"]


def _assert_encoder_matches(ours, expected, mask, skip_padding: bool) -> None:
    rows = mask[:, None, :].expand(-1, 4, -1)  # [B, H, T] real queries
    torch.testing.assert_close(
        ours.last_hidden_state[mask], expected.last_hidden_state[mask], atol=TOLERANCE, rtol=0
    )
    if skip_padding:
        assert not ours.last_hidden_state[~mask].any(), "padding positions must come out as zeros"
    assert len(ours.attentions) == len(expected.attentions)
    for layer, (mine, theirs) in enumerate(zip(ours.attentions, expected.attentions), start=1):
        assert mine.shape == theirs.shape, f"layer {layer}"
        assert not mine.masked_select(~mask[:, None, None, :]).any(), "padding keys got attention"
        torch.testing.assert_close(mine[rows], theirs[rows], atol=TOLERANCE, rtol=0, msg=f"layer {layer}")


@pytest.mark.parametrize("skip_padding", [True, False], ids=["skip-padding", "every-position"])
@pytest.mark.parametrize("family", sorted(CASES))
def test_encoder_matches_hf_eager(family, skip_padding, tmp_path):
    directory = _hf_dir(family, tmp_path, classifier=False)
    model = from_pretrained(directory)
    assert isinstance(model, TransformerEncoder)
    model.config.skip_padding = skip_padding
    input_ids, mask = _batch(_pad_id(family))
    with torch.no_grad():
        expected = _hf(directory, classifier=False)(
            input_ids, attention_mask=mask.long(), output_attentions=True
        )
        ours = model(input_ids, mask, output_attentions=True)
        fused = model(input_ids, mask).last_hidden_state
    _assert_encoder_matches(ours, expected, mask, skip_padding)
    torch.testing.assert_close(fused[mask], expected.last_hidden_state[mask], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family", sorted(CASES))
def test_classifier_logits_and_labels_match_hf(family, tmp_path):
    directory = _hf_dir(family, tmp_path, classifier=True)
    model = from_pretrained(directory)
    assert isinstance(model, EncoderClassifier)
    assert model.label_names == ["negative", "neutral", "positive"]
    input_ids, mask = _batch(_pad_id(family))
    with torch.no_grad():
        expected = _hf(directory, classifier=True)(input_ids, attention_mask=mask.long()).logits
        ours = model(input_ids, attention_mask=mask)
    torch.testing.assert_close(ours.logits, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family", sorted(CASES))
def test_save_pretrained_round_trip_opens_in_hf(family, tmp_path):
    for classifier in (False, True):
        model = from_pretrained(_hf_dir(family, tmp_path, classifier=classifier))
        exported = save_pretrained(model, tmp_path / f"{family}-{classifier}-export")
        hf = _hf(exported, classifier=classifier)
        assert type(hf).__name__ == CASES[family][3 if classifier else 2]
        input_ids, mask = _batch(_pad_id(family))
        with torch.no_grad():
            expected = hf(input_ids, attention_mask=mask.long(), output_attentions=not classifier)
            ours = model(input_ids, attention_mask=mask, output_attentions=not classifier)
        if classifier:
            torch.testing.assert_close(ours.logits, expected.logits, atol=TOLERANCE, rtol=0)
            assert hf.config.id2label == LABELS
        else:
            _assert_encoder_matches(ours, expected, mask, skip_padding=True)
        reloaded = from_pretrained(exported)
        for (name, mine), (_, theirs) in zip(model.state_dict().items(), reloaded.state_dict().items()):
            assert torch.equal(mine, theirs), name


@pytest.mark.parametrize("family", sorted(CASES))
def test_capture_and_head_masks_see_every_layer(family, tmp_path):
    model = from_pretrained(_hf_dir(family, tmp_path, classifier=False))
    input_ids, mask = _batch(_pad_id(family))
    layers = model.config.num_layers
    with torch.no_grad():
        expected = model(input_ids, mask, output_attentions=True).attentions
        with capture_attention(model) as captured:
            model(input_ids, mask)
        assert list(captured.attentions) == [f"layer_{index}" for index in range(1, layers + 1)]
        for index, weights in enumerate(expected):
            torch.testing.assert_close(captured.attentions[f"layer_{index + 1}"], weights, atol=0, rtol=0)
        with mask_heads(model, {"layer_2": [0, 1, 2, 3]}):
            masked = model(input_ids, mask, output_attentions=True).attentions
    torch.testing.assert_close(masked[0], expected[0], atol=0, rtol=0)  # layer 1 untouched
    assert not masked[1].any()  # every head of layer 2 removed
    assert not torch.allclose(masked[2], expected[2])  # later layers see it


# What the LRP relevance refuses, by the component its error names.
REFUSED_BY_RELEVANCE = {
    "modernbert": "rotary position embedding",
    "deberta-v2": "DeBERTa's disentangled attention",
    "deberta-v2-unshared": "DeBERTa's disentangled attention",
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_relevance_propagates_through_each_family_or_names_what_it_refuses(family, tmp_path):
    model = from_pretrained(_hf_dir(family, tmp_path, classifier=True))
    input_ids = _batch(_pad_id(family))[0][1:2]  # the unpadded text
    if family in REFUSED_BY_RELEVANCE:
        with pytest.raises(ValueError, match=REFUSED_BY_RELEVANCE[family]):
            attention_relevance(model, input_ids)
        return
    found = attention_relevance(model, input_ids)  # checks its recomputation against the model
    assert len(found.relevances) == model.encoder.config.num_layers
    assert all(torch.isfinite(relevance).all() and relevance.abs().sum() > 0 for relevance in found.relevances)
    if model.encoder.score_bias is None:  # else the bias keeps its share of the scores' relevance
        torch.testing.assert_close(found.input_relevance.sum(), torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize("family", ["roberta", "albert", "modernbert"])
def test_fine_tuned_family_encoder_reopens_from_an_attnlab_checkpoint(family, tmp_path):
    from attnlab.checkpoints import build_encoder, load_model, save_model

    encoder = build_encoder(VOCAB, pretrained=str(_hf_dir(family, tmp_path, classifier=True)), dropout=0.0)
    assert isinstance(encoder, TransformerEncoder)  # the checkpoint's own head is left behind
    model = EncoderClassifier(encoder, 2, pooling="first").eval()
    save_model(model, tmp_path / "checkpoint")
    reloaded = load_model(tmp_path / "checkpoint").model
    input_ids, mask = _batch(_pad_id(family))
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids, mask).logits, model(input_ids, mask).logits, atol=0, rtol=0
        )
    if family == "albert":  # the shared layer stays shared
        assert reloaded.encoder.layers[1].ffn.linear1.weight is reloaded.encoder.layers[0].ffn.linear1.weight


@pytest.mark.parametrize("family", sorted(CASES))
def test_masked_lm_logits_match_hf_and_export(family, tmp_path):
    directory = _hf_dir(family, tmp_path, classifier=False, masked_lm=True)
    model = from_pretrained(directory)
    assert isinstance(model, EncoderForMaskedLM)
    assert model.decoder.weight is model.encoder.embedding.weight  # still tied after loading
    input_ids, mask = _batch(_pad_id(family))
    exported = save_pretrained(model, tmp_path / f"{family}-mlm-export")
    for source in (directory, exported):
        hf = transformers.AutoModelForMaskedLM.from_pretrained(
            str(source), attn_implementation="eager"
        ).eval()
        with torch.no_grad():
            expected = hf(input_ids, attention_mask=mask.long()).logits
            ours = model(input_ids, attention_mask=mask).logits
        torch.testing.assert_close(ours[mask], expected[mask], atol=TOLERANCE, rtol=0)


def test_modernbert_mean_pooling_head_matches_hf(tmp_path, monkeypatch):
    options = {**CASES["modernbert"][1], "classifier_pooling": "mean", "classifier_activation": "silu"}
    monkeypatch.setitem(CASES, "modernbert", (CASES["modernbert"][0], options, *CASES["modernbert"][2:]))
    directory = _hf_dir("modernbert", tmp_path, classifier=True)
    model = from_pretrained(directory)
    assert model.pooling == "mean" and model.pooler.settings["activation"] == "silu"
    input_ids, mask = _batch(0)
    exported = save_pretrained(model, tmp_path / "export")
    for source in (directory, exported):
        with torch.no_grad():
            expected = _hf(source, classifier=True)(input_ids, attention_mask=mask.long()).logits
            torch.testing.assert_close(
                model(input_ids, attention_mask=mask).logits, expected, atol=TOLERANCE, rtol=0
            )


def test_auto_task_follows_the_tensors_present(tmp_path):
    from safetensors.torch import load_file, save_file

    # sentence-transformers writes base MPNet weights under architectures ["MPNetForMaskedLM"]
    directory = _hf_dir("mpnet", tmp_path, classifier=False, masked_lm=True)
    tensors = {
        name: tensor
        for name, tensor in load_file(str(directory / "model.safetensors")).items()
        if not name.startswith("lm_head.")
    }
    save_file(tensors, str(directory / "model.safetensors"))
    assert isinstance(from_pretrained(directory), TransformerEncoder)
    # the released ELECTRA discriminators are ElectraForPreTraining: their head is skipped
    config = getattr(transformers, CASES["electra"][0])(**CASES["electra"][1])
    transformers.ElectraForPreTraining(config).save_pretrained(tmp_path / "discriminator")
    assert isinstance(from_pretrained(tmp_path / "discriminator"), TransformerEncoder)


def test_a_masked_lm_file_that_repeats_its_tied_decoder_opens(tmp_path):
    from safetensors.torch import load_file, save_file

    directory = _hf_dir("roberta", tmp_path, classifier=False, masked_lm=True)
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["lm_head.decoder.weight"] = tensors["roberta.embeddings.word_embeddings.weight"].clone()
    tensors["lm_head.decoder.bias"] = tensors["lm_head.bias"].clone()
    save_file(tensors, str(directory / "model.safetensors"))
    assert isinstance(from_pretrained(directory), EncoderForMaskedLM)
