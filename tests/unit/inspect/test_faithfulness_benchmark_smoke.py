"""The faithfulness benchmark: its inputs and measures against forwards written out by hand, the
interval against Student's t, and tiny end-to-end runs (no timing asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer
from attnlab.inspect.compute.generation_attribution import GENERATION_METHODS
from attnlab.inspect.compute.token_attribution import METHODS
from attnlab.inspect.faithfulness import MEASURES

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
TEXTS = ["a fine film", "dull and long", "great fun", "not very good", "the plot is thin"] * 4


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def benchmark():
    try:
        yield _load("faithfulness_benchmark", "faithfulness.py")
    finally:
        sys.path.remove(str(BENCHMARKS))  # the script puts its folder on the path for its measures


@pytest.fixture(scope="module")
def measures(benchmark):
    return sys.modules["_faithfulness_measures"]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="the tiny decoder is written with transformers")
    from tokenizers import Tokenizer as RawTokenizer, models, pre_tokenizers

    words = sorted({word for text in TEXTS for word in text.split()} | {"<unk>", "<s>", "</s>"})
    raw = RawTokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    directory = tmp_path_factory.mktemp("lm")
    raw.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(words), hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(directory)
    return directory


def test_deletion_and_insertion_inputs_by_hand(measures):
    ids = [2, 10, 11, 12, 13, 3]  # [CLS] a b c d [SEP]
    deleted, inserted = measures.curve_inputs(ids, [1, 2, 3, 4], [3, 1, 2, 4])
    # without the top ceil(k * 4 / 100) tokens, k = 10 .. 100: 1, 1, 2, 2, 2, 3, 3, 4, 4, 4
    assert deleted[0] == deleted[1] == [2, 10, 11, 13, 3] and deleted[2] == [2, 11, 13, 3]
    assert deleted[-1] == [2, 3] and len(deleted) == 10
    # only the top k %, k = 0 .. 90, in the text's order, the special tokens kept
    assert inserted[0] == [2, 3] and inserted[1] == inserted[2] == [2, 12, 3]
    assert inserted[3] == [2, 10, 12, 3]
    assert inserted[-1] == [2, 10, 11, 12, 13, 3] and len(inserted) == 10


def test_interval_is_students_t(measures):
    mean, low, high = measures.interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) from the tables, sd = 1
    assert mean == 2.0 and low == pytest.approx(2 - half) and high == pytest.approx(2 + half)
    assert measures.interval([0.5]) == [0.5, 0.5, 0.5]


def test_every_measure_against_forwards_written_out(measures, tiny_llama):
    """Two ranked tokens: the normalised scores are exactly 1 and 0, so every Bernoulli mask is
    certain and soft comprehensiveness / sufficiency are single forwards with one token's
    embedding zeroed, computed here through transformers' ``inputs_embeds``."""
    import transformers

    import attnlab

    reference = transformers.LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    model, _, _ = attnlab.load(str(tiny_llama))
    ids, words, target = [4, 7, 9], [1, 2], 5  # position 0 stays (as a <bos> would)
    embeddings = reference.get_input_embeddings()(torch.tensor([ids])).detach()

    @torch.no_grad()
    def log_p(sequence: list[int]) -> float:
        logits = reference(torch.tensor([sequence])).logits[0, -1].double()
        return float(torch.log_softmax(logits, -1)[target])

    @torch.no_grad()
    def zeroed(position: int) -> float:
        kept = embeddings.clone()
        kept[0, position] = 0
        return float(torch.log_softmax(reference(inputs_embeds=kept).logits[0, -1].double(), -1)[target])

    quantity = measures.Quantity(model.eval(), target, decoder=True, pad_id=0, batch=4)
    found = measures.measure_input(quantity, ids, words, {"m": np.array([0.2, 3.0])}, draws=3,
                                   generator=torch.Generator().manual_seed(0))["m"]
    full = log_p(ids)
    top_gone = full - log_p([4, 7])  # k = 10 .. 50 %: the top token (position 2) deleted
    both_gone = full - log_p([4])  # k = 60 .. 100 %
    assert found["deletion_aopc"] == pytest.approx((5 * top_gone + 5 * both_gone) / 11, abs=1e-4)
    none = log_p([4])
    inserted = [0.0] + [log_p([4, 9]) - none] * 5 + [log_p(ids) - none] * 5  # k = 0, 10 .. 50, 60 .. 100
    assert found["insertion_aopc"] == pytest.approx(sum(inserted) / 11, abs=1e-4)
    assert found["soft_comprehensiveness"] == pytest.approx(full - zeroed(2), abs=1e-4)  # the top one dropped
    assert found["soft_sufficiency"] == pytest.approx(full - zeroed(1), abs=1e-4)  # only the top one kept


def test_a_tiny_classifier_run_records_every_method_and_measure(benchmark, tmp_path, capsys):
    tokenizer = Tokenizer(train_tokenizer(TEXTS, vocab_size=60, kind="wordpiece"))
    torch.manual_seed(0)
    encoder = TransformerEncoder(tokenizer.vocab_size, 16, 2, 2, 32, max_len=64,
                                 pad_id=tokenizer.pad_token_id)
    EncoderClassifier(encoder, 2).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    record = tmp_path / "record.json"
    assert benchmark.main(["--quick", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "out"),
                           "--record", str(record)]) == 0
    written = json.loads(record.read_text())
    assert written["primary"] == "deletion_aopc" and set(written["measures"]) == set(MEASURES)
    assert not written["measures"]["soft_sufficiency"]["higher_is_better"]
    (entry,) = written["families"]
    assert (entry["family"], entry["kind"], entry["texts"]) == ("bert", "classifier", 3)
    for measure in MEASURES:
        assert set(entry["figures"][measure]) == {*METHODS, "random"}
        assert all(low <= mean <= high for mean, low, high in entry["figures"][measure].values())
    assert (tmp_path / "out" / "faithfulness.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "| random |" in printed and "CPU: " in printed


def test_a_tiny_decoder_run_puts_every_method_and_random_side_by_side(benchmark, tiny_llama, tmp_path,
                                                                       capsys):
    assert benchmark.main(["--quick", "--decoder", str(tiny_llama), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "faithfulness.json").read_text())["models"][str(tiny_llama)]
    assert (result["family"], result["kind"]) == ("llama", "decoder")
    assert result["quantity"] == "log p(next token), nats"
    for measure in MEASURES:
        assert set(result["figures"][measure]) == {*GENERATION_METHODS, "random"}
    assert result["completeness_gap"] is not None  # integrated gradients ran
    assert "| occlusion |" in capsys.readouterr().out


def test_methods_at_or_below_random_are_marked(benchmark):
    figures = {measure: {"random": [1.0, 0.5, 1.5], "good": [3.0, 2.0, 4.0], "bad": [1.2, 0.4, 2.0]}
               for measure in MEASURES}
    entry = {"family": "llama", "kind": "decoder", "model": "m", "quantity": "q", "texts": 9,
             "figures": figures, "seconds_per_text": {}}
    lines = {line.split("|")[1].strip(): line for line in benchmark.table(entry).splitlines()[2:]}
    assert "*" not in lines["good"].split("|")[2] and "*" in lines["bad"].split("|")[2]  # deletion ↑
    assert "*" in lines["good"].split("|")[5]  # soft sufficiency ↓: 3.0 is worse than random's 1.0
