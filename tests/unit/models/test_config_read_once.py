"""One loading path: a directory's ``config.json`` is read once per load, through every door.

``attnlab.load`` looks at a directory once (``checkpoints/source.py``: the format, encoder
or decoder, an encoder's family) and hands the parsed ``config.json`` to the format's
reader; its aliases (``Class.from_pretrained``, ``from_pretrained``, ``load_model``,
``load_decoder``, ``build_encoder(pretrained=...)``) go through the same path. The tiny
BERT and Llama directories are written by ``transformers`` at test time.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab import EncoderClassifier, TransformerEncoder
from attnlab.checkpoints import (
    UnsupportedCheckpointError,
    build_encoder,
    load_decoder,
    load_model,
    open_source,
)
from attnlab.checkpoints.encoders.loading import bert_style_config
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip("transformers", reason="the tiny HuggingFace models are made with transformers")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24)
    directory = tmp_path_factory.mktemp("bert")
    transformers.BertModel(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    directory = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """An attnlab run: its own config.json (the run's settings) and checkpoints/best."""
    torch.manual_seed(0)
    config = bert_style_config(vocab_size=40, d_model=16, num_layers=1, num_heads=2, d_ff=32, max_len=24, pad_id=0)
    directory = tmp_path_factory.mktemp("run")
    EncoderClassifier(TransformerEncoder.from_config(config), 2).save_pretrained(directory / "checkpoints" / "best")
    (directory / "config.json").write_text(json.dumps({"task": "text-classification", "model": {"d_model": 16}}))
    return directory


@pytest.fixture
def config_reads(monkeypatch) -> list[str]:
    """Every opening of a file named config.json: ``Path.open`` (``read_bytes``,
    ``read_text`` and ``json.load(path.open())`` go through it) and ``open``."""
    reads: list[str] = []
    path_open, plain_open = Path.open, builtins.open

    def counting_path_open(self, *args, **kwargs):
        if self.name == "config.json":
            reads.append(str(self))
        return path_open(self, *args, **kwargs)

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).name == "config.json":
            reads.append(str(file))
        return plain_open(file, *args, **kwargs)

    monkeypatch.setattr(Path, "open", counting_path_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    return reads


def test_load_reads_a_bert_directorys_config_once(bert_dir, config_reads) -> None:
    model, _, config = attnlab.load(bert_dir)
    assert isinstance(model, TransformerEncoder) and config["model_type"] == "bert"
    assert config_reads == [str(bert_dir / "config.json")]


def test_load_reads_a_llama_directorys_config_once(llama_dir, config_reads) -> None:
    model, _, config = attnlab.load(llama_dir)
    assert isinstance(model, DecoderForCausalLM) and config["model_type"] == "llama"
    assert config_reads == [str(llama_dir / "config.json")]


def test_load_reads_a_runs_checkpoint_config_once_and_never_the_runs_own(run_dir, config_reads) -> None:
    model, _, config = attnlab.load(run_dir)
    assert isinstance(model, EncoderClassifier) and "encoder" in config
    assert config_reads == [str(run_dir / "checkpoints" / "best" / "config.json")]


@pytest.mark.parametrize("door", [
    "TransformerEncoder.from_pretrained", "attnlab.from_pretrained", "build_encoder", "load_model", "load_decoder",
    "DecoderForCausalLM.from_pretrained",
])
def test_every_alias_reads_config_once(door, bert_dir, llama_dir, run_dir, config_reads) -> None:
    opened = {
        "TransformerEncoder.from_pretrained": lambda: TransformerEncoder.from_pretrained(bert_dir),
        "attnlab.from_pretrained": lambda: attnlab.from_pretrained(bert_dir),
        "build_encoder": lambda: build_encoder(0, pretrained=str(bert_dir)),
        "load_model": lambda: load_model(run_dir).model,
        "load_decoder": lambda: load_decoder(llama_dir),
        "DecoderForCausalLM.from_pretrained": lambda: DecoderForCausalLM.from_pretrained(llama_dir),
    }[door]()
    assert isinstance(opened, (TransformerEncoder, EncoderClassifier, DecoderForCausalLM))
    assert len(config_reads) == 1, config_reads


def test_the_aliases_open_what_load_opens(bert_dir, llama_dir) -> None:
    ids = torch.tensor([[2, 5, 7, 3]])
    expected = attnlab.load(bert_dir).model(ids).last_hidden_state
    for model in (attnlab.from_pretrained(bert_dir), TransformerEncoder.from_pretrained(bert_dir),
                  build_encoder(0, pretrained=str(bert_dir))):
        torch.testing.assert_close(model(ids).last_hidden_state, expected, rtol=0, atol=0)
    logits = attnlab.load(llama_dir).model(ids).logits
    torch.testing.assert_close(load_decoder(llama_dir)(ids).logits, logits, rtol=0, atol=0)


def test_the_encoder_or_decoder_decision_is_made_once_and_named_in_errors(bert_dir, llama_dir, run_dir) -> None:
    assert open_source(llama_dir).is_decoder and not open_source(bert_dir).is_decoder
    assert open_source(bert_dir).family.name == "bert" and open_source(run_dir).format == "attnlab-run"
    with pytest.raises(UnsupportedCheckpointError, match=r"holds an encoder, not a decoder.*attnlab.load\("):
        load_decoder(bert_dir)
    with pytest.raises(ValueError, match=r"task='encoder': options of HuggingFace encoders; .* holds a decoder"):
        attnlab.load(llama_dir, task="encoder")
    with pytest.raises(UnsupportedCheckpointError, match=r"is an attnlab run directory, not a HuggingFace one"):
        attnlab.from_pretrained(run_dir)
    with pytest.raises(ValueError, match=r"is a HuggingFace checkpoint \(model_type 'llama'\)"):
        load_model(llama_dir)
    with pytest.raises(ImportError, match="attnlab.load"):
        from attnlab.checkpoints.decoders.loading import load_decoder_and_tokenizer  # noqa: F401


@pytest.fixture
def reader_reads(monkeypatch) -> list[str]:
    """The readings by ``attnlab.checkpoints.source.read_config``, the one reader of a model's
    ``config.json`` (patched where it reads)."""
    from attnlab.checkpoints import source

    reads: list[str] = []
    read_json = source.read_json

    def counting_read_json(path, *args, **kwargs):
        reads.append(str(path))
        return read_json(path, *args, **kwargs)

    monkeypatch.setattr(source, "read_json", counting_read_json)
    return reads


def test_every_reading_goes_through_the_one_reader(bert_dir, llama_dir, run_dir, config_reads, reader_reads) -> None:
    for directory in (bert_dir, llama_dir, run_dir):
        attnlab.load(directory)
    assert reader_reads == config_reads and len(reader_reads) == 3


def test_the_clis_model_door_reads_config_once(bert_dir, llama_dir, config_reads, reader_reads) -> None:
    from attnlab.inspect.commands.resolve import resolve_model

    for directory in (bert_dir, llama_dir):  # loaded, then refused for want of a tokenizer
        with pytest.raises(ValueError, match="no tokenizer.json"):
            resolve_model(str(directory))
    assert reader_reads == config_reads == [str(bert_dir / "config.json"), str(llama_dir / "config.json")]


def test_a_fine_tuning_runs_looks_at_the_pretrained_config_go_through_the_one_reader(
    bert_dir, config_reads, reader_reads
) -> None:
    """Three looks, one reading each: the recipe's width, the check before anything is
    written, the load of the encoder."""
    from attnlab.train.run_checks import check_run
    from attnlab.train.run_config import resolve_run_config

    config = resolve_run_config(None, [f'model.pretrained="{bert_dir}"', "data.max_length=16"])
    assert config.train.learning_rate == 1e-4  # width 16: the compact encoders' rate
    check_run(config, None)
    build_encoder(0, pretrained=str(bert_dir))
    assert reader_reads == config_reads == [str(bert_dir / "config.json")] * 3
