"""A checkpoint's safetensors read one tensor at a time (one file or shards), and the load dtype."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from safetensors.torch import save_file
from torch import nn

import attnlab
from attnlab._files import CorruptFileError
from attnlab.checkpoints import tensors as checkpoint_tensors
from attnlab.checkpoints.tensors import CheckpointTensors, parameters_on_meta, resolve_dtype
from attnlab.checkpoints.encoders.loading import bert_style_config, save_pretrained


def _sharded(directory, tensors: dict[str, torch.Tensor], shards: int = 2):
    """``tensors`` written as ``shards`` files and an index, as transformers writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for index in range(shards):
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[index::shards]}
        save_file(part, str(directory / file))
        weight_map.update(dict.fromkeys(part, file))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


def _tiny_bert_dir(directory):
    """A tiny BERT in its HuggingFace layout, its model.safetensors split into three shards."""
    torch.manual_seed(0)
    config = bert_style_config(vocab_size=40, d_model=16, num_layers=2, num_heads=2, d_ff=24, max_len=16,
                               pad_id=0)
    encoder = attnlab.TransformerEncoder.from_config(config).eval()
    save_pretrained(encoder, directory)
    tensors = safetensors.torch.load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    _sharded(directory, tensors, shards=3)
    return encoder


@pytest.mark.parametrize("value, expected", [
    (None, torch.float32), ("float32", torch.float32), ("bfloat16", torch.bfloat16),
    ("float16", torch.float16), ("auto", "auto"), ("BFloat16", torch.bfloat16),
    ("torch.float16", torch.float16), (torch.bfloat16, torch.bfloat16),
])
def test_resolve_dtype_reads_the_four_choices(value, expected):
    assert resolve_dtype(value) == expected


@pytest.mark.parametrize("value", ["fp8", "int8", torch.float64, torch.int64, 16])
def test_a_bad_dtype_is_one_line_naming_the_argument_and_the_choices(value, tmp_path):
    with pytest.raises(ValueError, match=r"^dtype must be one of float32, bfloat16, float16, auto") as error:
        resolve_dtype(value)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"^--dtype must be one of"):
        resolve_dtype(value, argument="--dtype")
    with pytest.raises(ValueError, match=r"^dtype must be one of"):  # before anything is read
        attnlab.load(tmp_path, dtype=value)


def test_shards_are_read_one_tensor_at_a_time_from_headers_and_converted(tmp_path):
    tensors = {"a": torch.randn(3, 4, dtype=torch.bfloat16), "b": torch.randn(7, dtype=torch.bfloat16),
               "norm": torch.ones(2), "ids": torch.arange(5)}
    source = CheckpointTensors.open(_sharded(tmp_path / "ckpt", tensors))
    assert set(source) == set(tensors) and len(source) == 4 and "a" in source and "z" not in source
    assert source.shape("a") == (3, 4) and source.shape("ids") == (5,)
    assert source.stored_dtype() == torch.bfloat16  # 19 bfloat16 values against 2 float32 ones
    assert torch.equal(source["a"], tensors["a"]) and source["a"].dtype == torch.bfloat16
    converted = source.converted(torch.float32)
    assert converted["a"].dtype == torch.float32 and torch.equal(converted["a"], tensors["a"].float())
    assert converted["ids"].dtype == torch.int64  # only floating-point tensors change dtype


def test_a_missing_shard_and_a_damaged_index_are_named(tmp_path):
    directory = _sharded(tmp_path / "ckpt", {"a": torch.zeros(2), "b": torch.zeros(3)})
    index = directory / "model.safetensors.index.json"
    content = json.loads(index.read_text())
    content["weight_map"]["c"] = "model-00001-of-00002.safetensors"  # not in that shard
    index.write_text(json.dumps(content))
    with pytest.raises(CorruptFileError, match=r"lacks 1 tensor\(s\) its index names, e.g. c"):
        CheckpointTensors.open(directory)
    content["weight_map"]["c"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(content))
    with pytest.raises(CorruptFileError, match=r"shards are file names in its directory"):
        CheckpointTensors.open(directory)
    del content["weight_map"]["c"]
    index.write_text(json.dumps(content))
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"names shards that are missing: model-00002-of-00002"):
        CheckpointTensors.open(directory)
    index.write_text("{}")
    with pytest.raises(CorruptFileError, match=r"no 'weight_map'"):
        CheckpointTensors.open(directory)


@pytest.mark.parametrize("large", [True, False], ids=["large-on-meta", "small-initialised"])
def test_an_encoder_is_read_one_tensor_at_a_time_into_storage_free_parameters(large, tmp_path, monkeypatch):
    encoder = _tiny_bert_dir(tmp_path / "bert")
    if large:  # as if it had 50M values: its parameters are built on the meta device
        monkeypatch.setattr(checkpoint_tensors, "META_BUILD_VALUES", 0)
    reads: list[str] = []
    read = CheckpointTensors.__getitem__

    def counting(self, name):
        reads.append(name)
        return read(self, name)

    def whole_file(*args, **kwargs):
        raise AssertionError("the whole checkpoint was read at once")

    initialised: list[torch.Tensor] = []
    normal = nn.init.normal_

    def recording_normal(tensor, *args, **kwargs):
        initialised.append(tensor)
        return normal(tensor, *args, **kwargs)

    monkeypatch.setattr(CheckpointTensors, "__getitem__", counting)
    monkeypatch.setattr(safetensors.torch, "load_file", whole_file)
    monkeypatch.setattr(nn.init, "normal_", recording_normal)
    loaded = attnlab.load(tmp_path / "bert", dtype="bfloat16").model
    assert len(reads) == len(set(reads)) > 0
    # a large model's parameters have no storage to fill at random; a small one's are filled, then replaced
    assert initialised and all(tensor.is_meta == large for tensor in initialised)
    assert {parameter.dtype for parameter in loaded.parameters()} == {torch.bfloat16}
    assert torch.equal(loaded.embedding.weight, encoder.embedding.weight.to(torch.bfloat16))


def test_parameters_on_meta_leaves_buffers_real_and_ends_even_on_error():
    with parameters_on_meta():
        layer = nn.Linear(3, 2)
        layer.register_buffer("table", torch.arange(3.0))
    assert layer.weight.is_meta and layer.bias.is_meta and not layer.table.is_meta
    with pytest.raises(RuntimeError, match="inside"):
        with parameters_on_meta():
            raise RuntimeError("inside")
    assert not nn.Linear(3, 2).weight.is_meta


def test_an_attnlab_checkpoint_opens_in_the_dtype_asked_and_auto_keeps_its_own(tmp_path):
    torch.manual_seed(0)
    config = bert_style_config(vocab_size=40, d_model=16, num_layers=1, num_heads=2, d_ff=24, max_len=16,
                               pad_id=0)
    classifier = attnlab.EncoderClassifier(attnlab.TransformerEncoder.from_config(config), 2).to(torch.bfloat16)
    classifier.save_pretrained(tmp_path / "run")
    dtypes = {requested: {parameter.dtype for parameter in attnlab.load(tmp_path / "run", dtype=requested)
                          .model.parameters()} for requested in (None, "auto", "float16")}
    assert dtypes == {None: {torch.float32}, "auto": {torch.bfloat16}, "float16": {torch.float16}}
    again = attnlab.load(tmp_path / "run", dtype="auto").model
    assert torch.equal(again.encoder.embedding.weight, classifier.encoder.embedding.weight)
