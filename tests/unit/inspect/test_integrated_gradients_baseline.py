"""Integrated gradients' baselines (pad, zero, mean embedding): where the path starts, exact
values on a linear model, captum on a classifier, completeness reported, bad names refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import TransformerEncoder
from attnlab.inspect.compute.integrated_gradients import integrated_gradients
from attnlab.inspect.compute.integrated_gradients_baseline import (BASELINES, baseline_embeddings, check_baseline,
                                                                   mean_embedding)
from attnlab.inspect.compute.integrated_gradients_steps import AUTO_STEPS, COMPLETENESS_TOLERANCE
from attnlab.inspect.compute.token_attribution import attribute_tokens
from attnlab.models.classifier import EncoderClassifier
from attnlab.workflows.explain_text import explain, write_explanation

IDS = torch.tensor([[2, 5, 6, 7, 8, 3]])


def _classifier() -> EncoderClassifier:
    torch.manual_seed(0)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 3).eval()


class _Scaled(nn.Embedding):
    """Gemma's way: the module multiplies its rows by sqrt(E)."""

    def forward(self, ids):
        return super().forward(ids) * self.embedding_dim ** 0.5


def test_zero_starts_at_the_zero_vector_and_mean_at_the_mean_row_kept_positions_aside():
    torch.manual_seed(0)
    embedding = nn.Embedding(11, 4)
    keep = torch.tensor([[True, False, False, True]])
    ids = torch.tensor([[1, 4, 5, 2]])
    zero = baseline_embeddings(embedding, ids, "zero", keep=keep)
    assert torch.equal(zero[0, 1:3], torch.zeros(2, 4))
    assert torch.equal(zero[0, [0, 3]], embedding(ids)[0, [0, 3]].detach())  # [CLS]/[SEP] stay
    mean = baseline_embeddings(embedding, ids, "mean")
    torch.testing.assert_close(mean[0], embedding.weight.detach().mean(0).expand(4, 4), rtol=1e-6, atol=1e-7)
    pad = baseline_embeddings(embedding, ids, "pad", baseline_ids=torch.zeros_like(ids))
    assert torch.equal(pad, embedding.weight.detach()[0].expand(1, 4, 4))


def test_the_mean_is_taken_at_the_embeddings_output_so_a_scaled_embedding_stays_scaled():
    torch.manual_seed(0)
    embedding = _Scaled(10_000, 4)  # more rows than one chunk of the average
    torch.testing.assert_close(mean_embedding(embedding), embedding.weight.detach().mean(0) * 2.0, rtol=1e-5,
                               atol=1e-7)


@pytest.mark.parametrize("baseline", BASELINES)
def test_on_a_linear_model_the_scores_are_the_input_minus_the_baseline_times_the_weight(baseline):
    # embedding -> mean over tokens -> linear: IG = (x - x') . w / T exactly, whatever x'
    class Linear(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = TransformerEncoder(10, d_model=4, num_layers=1, num_heads=1, d_ff=4, pad_id=0)
            self.head = nn.Linear(4, 2)

        def forward(self, ids, mask=None):
            return (self.head(self.encoder.embedding(ids).mean(1)),)

    torch.manual_seed(0)
    model = Linear()
    ids = torch.tensor([[3, 4, 5]])
    weight = model.encoder.embedding.weight.detach()
    start = {"pad": weight[0], "zero": torch.zeros(4), "mean": weight.mean(0)}[baseline]
    result = integrated_gradients(model, ids, target=0, steps=4, baseline=baseline)
    expected = (weight[ids] - start) @ model.head.weight.detach()[0] / 3
    torch.testing.assert_close(result.scores, expected, rtol=1e-5, atol=1e-6)
    assert abs(float(result.delta[0])) < 1e-5


@pytest.mark.parametrize("baseline", ["zero", "mean"])
def test_zero_and_mean_equal_captums_integrated_gradients_over_the_embeddings(baseline):
    captum = pytest.importorskip("captum.attr")
    model = _classifier().double()
    embedding = model.encoder.embedding
    ours = integrated_gradients(model, IDS, target=1, steps=24, baseline=baseline)
    inputs = embedding(IDS).detach()
    start = torch.zeros_like(inputs) if baseline == "zero" else embedding.weight.detach().mean(0).expand_as(inputs)

    def forward(embeddings):  # the classifier with its token embedding's output given
        handle = embedding.register_forward_hook(lambda module, args, output: embeddings)
        try:
            return model(IDS.repeat(embeddings.shape[0], 1)).logits
        finally:
            handle.remove()

    theirs = captum.IntegratedGradients(forward).attribute(inputs, baselines=start, target=1, n_steps=24)
    torch.testing.assert_close(ours.attributions.double(), theirs, rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        change = forward(inputs)[0, 1] - forward(start)[0, 1]
    assert float(ours.delta[0]) == pytest.approx(float(theirs.sum() - change), abs=1e-5)


@pytest.mark.parametrize("baseline", BASELINES)
def test_explain_reaches_completeness_with_auto_steps_and_reports_the_gap(baseline, tmp_path):
    model = _classifier()
    explained = explain(model, _tokenizer(), "w5 w6 w7 w8", ["integrated-gradients"], baseline=baseline)
    assert explained.integrated_gradients_steps in AUTO_STEPS
    assert explained.integrated_gradients_gap <= COMPLETENESS_TOLERANCE
    import json

    write_explanation(explained, tmp_path)
    written = json.loads((tmp_path / "explanation.json").read_text())
    assert written["integrated_gradients_baseline"] == baseline
    assert written["integrated_gradients_completeness_gap"] == pytest.approx(explained.integrated_gradients_gap)
    assert written["integrated_gradients_complete"] is True
    assert "warning" not in written["integrated_gradients_note"]
    assert f"{baseline} baseline" in (tmp_path / "explanation.html").read_text()


def test_a_gap_over_five_percent_is_a_warning_in_the_json_and_on_the_page(tmp_path):
    model = _classifier()
    with torch.no_grad():
        model.encoder.embedding.weight.mul_(6.0)  # far from linear: one point integrates it badly
    explained = explain(model, _tokenizer(), "w5 w6 w7 w8", ["integrated-gradients"], steps=1)
    assert explained.integrated_gradients_gap > COMPLETENESS_TOLERANCE
    write_explanation(explained, tmp_path)
    import json

    written = json.loads((tmp_path / "explanation.json").read_text())
    assert written["integrated_gradients_complete"] is False
    assert written["integrated_gradients_note"].startswith("warning: 1 points")
    assert "warning: 1 points" in (tmp_path / "explanation.html").read_text()


def test_bad_baselines_are_refused_in_one_line():
    model = _classifier()
    for call in (lambda: integrated_gradients(model, IDS, baseline="zeros"),
                 lambda: attribute_tokens(model, IDS, ["integrated-gradients"], baseline="average"),
                 lambda: explain(model, _tokenizer(), "w5", baseline=None)):
        with pytest.raises(ValueError, match=r"baseline must be one of pad, zero, mean") as error:
            call()
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="--baseline must be one of"):
        check_baseline("Zero", "--baseline")


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab.data import Tokenizer as Wrapped

    inner = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 30)}},
                                       unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return Wrapped(inner)
