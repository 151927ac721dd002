"""Integrated gradients' completeness gap, and the steps chosen until it is small."""

from __future__ import annotations

import pytest
import torch

from attnlab import TransformerEncoder
from attnlab.inspect.commands.explain_text import explain
from attnlab.inspect.compute.integrated_gradients import integrated_gradients
from attnlab.inspect.compute.integrated_gradients_steps import (
    AUTO_STEPS, COMPLETENESS_TOLERANCE, completeness_gap, until_complete,
)
from attnlab.models.classifier import EncoderClassifier

IDS = torch.tensor([[2, 5, 6, 7, 8, 3]])


def _classifier() -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0)
    with torch.no_grad():
        encoder.embedding.weight.mul_(6.0)  # a path far from linear: few points integrate it badly
    return EncoderClassifier(encoder, 3).eval()


@pytest.mark.filterwarnings("ignore:mask marks")  # the baseline: pad ids under the input's mask, on purpose
def test_the_gap_is_the_error_against_the_objectives_change_from_the_baseline():
    model = _classifier()
    result = integrated_gradients(model, IDS, baseline_ids=torch.zeros_like(IDS), target=1, steps=4)
    with torch.no_grad():
        baseline = model(torch.zeros_like(IDS), mask=torch.ones_like(IDS, dtype=torch.bool))  # pads as tokens
        change = model(IDS).logits[0, 1] - baseline.logits[0, 1]
    want = abs(float(result.delta[0])) / abs(float(change))
    assert abs(completeness_gap(result.scores, result.delta) - want) < 1e-4 * max(want, 1.0)


def test_steps_double_until_the_gap_is_under_the_tolerance_and_given_steps_are_kept():
    model = _classifier()
    tried = []

    def run(points):
        tried.append(points)
        result = integrated_gradients(model, IDS, baseline_ids=torch.zeros_like(IDS), target=1, steps=points)
        return result, result.scores, result.delta

    one_point, _, one_gap = until_complete(run, 1)
    assert tried == [1] and one_gap > COMPLETENESS_TOLERANCE  # given steps are kept, however far off
    tried.clear()
    _, steps, gap = until_complete(run, None)
    assert tried == list(AUTO_STEPS[: len(tried)]) and steps == tried[-1]
    assert gap <= COMPLETENESS_TOLERANCE or steps == AUTO_STEPS[-1]


def test_explain_reports_the_steps_and_gap_it_ended_with():
    model = _classifier()
    tokenizer = _tokenizer()
    explained = explain(model, tokenizer, "w5 w6 w7 w8", ["raw", "integrated-gradients"])
    assert explained.integrated_gradients_steps in AUTO_STEPS
    assert explained.integrated_gradients_gap <= COMPLETENESS_TOLERANCE
    fixed = explain(model, tokenizer, "w5 w6 w7 w8", ["integrated-gradients"], steps=1)
    assert fixed.integrated_gradients_steps == 1 and fixed.integrated_gradients_gap > COMPLETENESS_TOLERANCE
    assert fixed.to_dict()["integrated_gradients_completeness_gap"] == fixed.integrated_gradients_gap


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab.data import Tokenizer as Wrapped

    inner = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 30)}},
                                       unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return Wrapped(inner)
