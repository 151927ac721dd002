"""Every inspection feature against every kind of model: it works, or it refuses in one line.

Each feature is called as a user calls it (the public function, on the model ``attnlab.load``
gives: attnlab's own, or a :class:`~attnlab.hf.opening.TransformersModel`), on tiny random
models of six kinds. A cell is ``works`` when the call returns what the feature promises, or
the one-line reason the feature gave (a ``ValueError``/``TypeError`` whose message is one
line); any other exception, or a message over several lines, fails the test: a crash is a
defect. The README's table of what works where is this matrix
(``ATTNLAB_WRITE_FEATURE_MATRIX=1`` rewrites it when a cell changes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers columns need the hf extra")

from tokenizers import Tokenizer as BackendTokenizer, models, pre_tokenizers  # noqa: E402

from attnlab import TransformerEncoder  # noqa: E402
from attnlab.data.tokenizer import Tokenizer  # noqa: E402
from attnlab.hf.opening import TransformersModel  # noqa: E402
from attnlab.inspect import (AttentionAnalyzer, attention_relevance, attribute_generation, attribute_tokens,  # noqa: E402
                             capture_attention, compare_models, find_head_roles, head_importance, logit_lens,
                             mask_heads, patch_heads, patch_layers)
from attnlab.workflows.generate_text import generate_text  # noqa: E402
from attnlab.inspect.compute.inspectable import inspectable  # noqa: E402
from attnlab.workflows.inspect_text import write_inspection  # noqa: E402
from attnlab.layers.decoder_config import DecoderConfig  # noqa: E402
from attnlab.models.classifier import EncoderClassifier  # noqa: E402
from attnlab.models.decoder import DecoderForCausalLM  # noqa: E402

README = Path(__file__).resolve().parents[3] / "README.md"
BEGIN, END = "<!-- feature matrix: begin -->", "<!-- feature matrix: end -->"
VOCAB = 40
IDS = torch.tensor([[2, 5, 6, 7, 8, 9, 3]])
TEXT = "w5 w6 w7 w8 w9"


def _tokenizer() -> Tokenizer:
    vocabulary = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = BackendTokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return Tokenizer(backend)


def _own_encoder():
    torch.manual_seed(0)
    encoder = TransformerEncoder(VOCAB, d_model=16, num_layers=2, num_heads=4, d_ff=32, pad_id=0)
    return EncoderClassifier(encoder, 2, label_names=["no", "yes"]).eval()


def _own_decoder():
    torch.manual_seed(0)
    return DecoderForCausalLM(DecoderConfig(vocab_size=VOCAB, d_model=16, num_layers=2, num_heads=4, d_ff=32,
                                            num_kv_heads=2)).eval()


def _served(model) -> TransformersModel:
    return TransformersModel(model.eval(), name=type(model).__name__)


def _bert():
    torch.manual_seed(0)
    return _served(transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        max_position_embeddings=32, num_labels=2, pad_token_id=0)))


def _llama():
    torch.manual_seed(0)
    return _served(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, eos_token_id=3)))


def _bart():
    torch.manual_seed(0)
    return _served(transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)))


def _vit():
    torch.manual_seed(0)
    return _served(transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32, num_labels=2)))


KINDS: dict[str, Callable[[], Any]] = {
    "attnlab encoder": _own_encoder,
    "attnlab decoder": _own_decoder,
    "transformers encoder": _bert,
    "transformers decoder": _llama,
    "transformers encoder-decoder": _bart,
    "transformers vision": _vit,
}


def _forward(model):
    if getattr(model, "kind", None) == "vision":
        return model.model(pixel_values=torch.randn(1, 3, 16, 16))
    return model(IDS, mask=torch.ones_like(IDS, dtype=torch.bool))


def _is_decoder(model) -> bool:
    return getattr(model, "kind", None) == "decoder" or hasattr(model, "new_cache")


def _first_layer(model) -> str:
    return inspectable(model).attention_sites()[0].name


def capture(model, tmp):
    with capture_attention(model) as seen:
        _forward(model)
    assert seen.attentions and all(weights.dim() == 4 for weights in seen.attentions.values())


def statistics(model, tmp):
    result = AttentionAnalyzer(model).analyze_attention_distribution([IDS])
    assert result.layers and result["entropy"][0][0] is not None


def head_mask(model, tmp):
    layer = _first_layer(model)
    with torch.no_grad():
        before = _forward(model)[0]
        with mask_heads(model, {layer: [0, 1]}):
            after = _forward(model)[0]
    assert not torch.allclose(before, after)


def patch(model, tmp):
    layer = _first_layer(model)
    result = patch_heads(model, IDS, IDS.flip(1), {layer: [0]})
    assert torch.isfinite(result.patched).all()


def layer_patch(model, tmp):
    result = patch_layers(model, IDS, IDS.flip(1), [0])
    assert torch.isfinite(result.patched).all() and not torch.allclose(result.patched, result.clean)


def importance(model, tmp):
    scores = head_importance(model, [(IDS, torch.tensor([1]))])
    assert scores.shape[0] >= 2 and bool((scores >= 0).all())


def rollout(model, tmp):
    result = AttentionAnalyzer(model).analyze_attention_distribution([IDS])
    assert result.rollout, "no rollout summary"


def _explain(method: str):
    def run(model, tmp):
        if _is_decoder(model):
            scores = attribute_generation(model, IDS, 4, [method]).scores[method]
        else:
            scores = attribute_tokens(model, IDS, [method]).scores[method]
        assert torch.isfinite(scores).all()

    run.__name__ = f"explain {method}"
    return run


def lrp(model, tmp):
    relevance = attention_relevance(model, IDS)
    assert torch.isfinite(relevance.input_relevance).all()


def lens(model, tmp):
    result = logit_lens(model, IDS)
    assert result.top_ids.shape[0] == len(result.layers)


def head_roles(model, tmp):
    roles = find_head_roles(model, length=6)
    assert roles.scores


def compare(model, tmp):
    tokenizer = _tokenizer()
    comparison = compare_models(model, tokenizer, model, tokenizer, [(TEXT, None)])
    assert comparison.result


def report(model, tmp):
    inspection = write_inspection(model, _tokenizer(), TEXT, tmp / "report", formats=("png",))
    assert inspection.report.is_file()


def generation_report(model, tmp):
    generation = generate_text(model, _tokenizer(), TEXT, max_new_tokens=2, report_dir=tmp / "generation",
                               model_name="DIR")
    assert generation.report.is_file()


FEATURES: dict[str, Callable] = {
    "capture": capture,
    "statistics": statistics,
    "head mask": head_mask,
    "head patching": patch,
    "layer patching": layer_patch,
    "head importance": importance,
    "rollout summaries": rollout,
    **{f"explain: {method}": _explain(method) for method in (
        "raw", "rollout", "flow", "grad-attention", "integrated-gradients", "occlusion", "attn-lrp")},
    "LRP": lrp,
    "logit lens": lens,
    "head roles": head_roles,
    "compare": compare,
    "report": report,
    "generation report": generation_report,
}


def _cell(feature: Callable, model, tmp: Path) -> str:
    try:
        feature(model, tmp)
    except (ValueError, TypeError) as error:
        message = str(error)
        assert "\n" not in message.strip(), f"{feature.__name__}: a refusal of several lines: {message!r}"
        names = {type(model).__name__, inspectable(model).architecture}  # said alike in every column
        return "no: " + re.sub(r"\b(" + "|".join(sorted(names)) + r")\b", "the model", message)
    return "works"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict[str, dict[str, str]]:
    cells: dict[str, dict[str, str]] = {feature: {} for feature in FEATURES}
    for kind, build in KINDS.items():
        model = build()
        for name, feature in FEATURES.items():
            cells[name][kind] = _cell(feature, model, tmp_path_factory.mktemp(re.sub(r"\W", "_", name)))
    return cells


def table(cells: dict[str, dict[str, str]]) -> str:
    """The README's table: ✓ where a feature works, ✗ and a footnote where it refuses."""
    notes: list[str] = []
    rows = ["| feature | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
    for feature, by_kind in cells.items():
        marks = []
        for kind in KINDS:
            cell = by_kind[kind]
            if cell == "works":
                marks.append("✓")
                continue
            reason = cell.removeprefix("no: ")
            if reason not in notes:
                notes.append(reason)
            marks.append(f"✗ {notes.index(reason) + 1}")
        rows.append(f"| {feature} | " + " | ".join(marks) + " |")
    footnotes = [f"{index}. {reason}" for index, reason in enumerate(notes, 1)]
    return "\n".join(rows + [""] + footnotes)


def test_every_feature_works_or_refuses_in_one_line_and_the_readme_shows_it(matrix):
    expected = table(matrix)
    text = README.read_text(encoding="utf-8")
    if os.environ.get("ATTNLAB_WRITE_FEATURE_MATRIX") == "1":
        before, rest = text.split(BEGIN, 1)
        README.write_text(before + BEGIN + "\n" + expected + "\n" + END + rest.split(END, 1)[1], encoding="utf-8")
        text = README.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "README.md lacks the feature matrix markers"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == expected, "README's feature matrix differs; ATTNLAB_WRITE_FEATURE_MATRIX=1 rewrites it:\n" + expected


def test_the_core_features_work_on_every_kind_of_text_model(matrix):
    for feature in ("capture", "statistics", "head mask", "head importance"):
        for kind in KINDS:
            if kind != "transformers vision":
                assert matrix[feature][kind] == "works", (feature, kind, matrix[feature][kind])
