"""AttnLRP (``attn-lrp``) on classifiers: a tiny random BERT classifier, served by attnlab's backend
and read into attnlab's own ``EncoderClassifier``, against lxt's BERT rules on transformers' eager
model; texts of a batch explained each on its own; ``attribute_tokens``' branch."""

from __future__ import annotations

import copy

import pytest
import torch

from attnlab.checkpoints.encoders.loading import from_pretrained
from attnlab.hf.opening import as_inspectable
from attnlab.inspect.compute.attn_lrp import attn_lrp_classifier
from attnlab.inspect.compute.attn_lrp_rules import attn_lrp_rules
from attnlab.inspect.compute.token_attribution import DEFAULT_METHODS, METHODS, attribute_tokens

from lxt_reference import lxt_classifier_relevance  # tests/unit/inspect/lxt_reference.py

transformers = pytest.importorskip("transformers", reason="the tiny BERT is made with transformers")

IDS = torch.tensor([[2, 5, 7, 9, 11, 3]])


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny random BERT classifier (biases and norms spread), its directory and lxt's relevances."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=48, max_position_embeddings=32,
                                     num_labels=3, pad_token_id=0, initializer_range=0.2)
    model = transformers.BertForSequenceClassification(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.3)
    directory = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(directory)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    target = int(model(IDS).logits[0].argmax())
    return model, directory, target, lxt_classifier_relevance(eager, IDS, target)


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return float((ours.double() - theirs.double()).abs().max() / theirs.abs().max()) <= 1e-4


def test_bert_through_attnlabs_backend_equals_lxt(bert):
    model, _, target, expected = bert
    result = attn_lrp_classifier(as_inspectable(copy.deepcopy(model)), IDS)
    assert int(result.target[0]) == target
    assert _close(result.scores[0], expected)
    assert torch.allclose(result.total, result.scores.sum(-1))


def test_attnlabs_own_classifier_equals_lxt_on_the_same_weights(bert):
    _, directory, target, expected = bert
    own = from_pretrained(directory).eval()
    result = attn_lrp_classifier(own, IDS, target=target)
    assert _close(result.scores[0], expected)


def test_forward_unchanged_and_each_text_explained_on_its_own(bert):
    _, directory, _, _ = bert
    own = from_pretrained(directory).eval()
    batch = torch.tensor([[2, 5, 7, 9, 11, 3], [2, 8, 6, 3, 0, 0]])
    mask = batch != 0
    with torch.no_grad():
        before = own(batch, mask=mask).logits
        with attn_lrp_rules(own):
            assert torch.equal(own(batch, mask=mask).logits, before)
    together = attn_lrp_classifier(own, batch, mask)
    for row in range(2):
        length = int(mask[row].sum())
        alone = attn_lrp_classifier(own, batch[row:row + 1, :length], target=int(together.target[row]))
        assert torch.allclose(together.scores[row, :length], alone.scores[0], atol=1e-6)
        assert torch.allclose(together.logit[row], alone.logit[0], atol=1e-6)


def test_attribute_tokens_branch(bert):
    _, directory, target, expected = bert
    own = from_pretrained(directory).eval()
    result = attribute_tokens(own, IDS, ["attn-lrp"], target=target)
    assert _close(result.scores["attn-lrp"][0], expected)
    assert result.attn_lrp_logit is not None and result.attn_lrp_sum is not None
    assert int(result.target[0]) == target and result.logits.shape == (1, 3)
    assert "attn-lrp" in METHODS and "attn-lrp" not in DEFAULT_METHODS
