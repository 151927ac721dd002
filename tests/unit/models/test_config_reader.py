"""Every reading of a model's ``config.json`` goes through one function,
``attnlab.checkpoints.source.read_config``: one reading per ``attnlab.load``, per door (the
CLI's ``--model`` included), and a fine-tuning run's looks at ``model.pretrained`` go
through it too.

The reader is patched where it reads (``source.read_json``), and every opening of a file
named ``config.json`` is counted beside it, so a second reader elsewhere would show.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.checkpoints import source

transformers = pytest.importorskip("transformers", reason="the tiny HuggingFace models are made with transformers")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24)
    directory = tmp_path_factory.mktemp("bert")
    transformers.BertModel(config).save_pretrained(directory)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"word{index}" for index in range(35)]
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    directory = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


class Reads:
    """``through_reader``: the readings by ``read_config``; ``opened``: every ``config.json`` opened."""

    def __init__(self) -> None:
        self.through_reader: list[str] = []
        self.opened: list[str] = []


@pytest.fixture
def reads(monkeypatch) -> Reads:
    counted = Reads()
    read_json, path_open, plain_open = source.read_json, Path.open, builtins.open

    def counting_read_json(path, *args, **kwargs):
        counted.through_reader.append(str(path))
        return read_json(path, *args, **kwargs)

    def counting_path_open(self, *args, **kwargs):
        if self.name == "config.json":
            counted.opened.append(str(self))
        return path_open(self, *args, **kwargs)

    def counting_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and Path(file).name == "config.json":
            counted.opened.append(str(file))
        return plain_open(file, *args, **kwargs)

    monkeypatch.setattr(source, "read_json", counting_read_json)
    monkeypatch.setattr(Path, "open", counting_path_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    return counted


@pytest.mark.parametrize("which", ["bert", "llama"])
def test_load_reads_config_once_through_the_one_reader(which, bert_dir, llama_dir, reads) -> None:
    directory = {"bert": bert_dir, "llama": llama_dir}[which]
    attnlab.load(directory)
    assert reads.through_reader == reads.opened == [str(directory / "config.json")]


def test_the_clis_model_door_reads_config_once(bert_dir, llama_dir, reads) -> None:
    from attnlab.inspect.commands.resolve import resolve_model

    resolved = resolve_model(str(bert_dir))
    assert resolved.tokenizer is not None and resolved.source == "pretrained"
    assert reads.through_reader == reads.opened == [str(bert_dir / "config.json")]
    with pytest.raises(ValueError, match="no tokenizer.json"):  # loaded, then refused for want of a tokenizer
        resolve_model(str(llama_dir))
    assert reads.through_reader == reads.opened == [str(bert_dir / "config.json"), str(llama_dir / "config.json")]


def test_a_fine_tuning_runs_looks_at_the_pretrained_config_go_through_the_one_reader(bert_dir, reads) -> None:
    """Three looks, one reading each: the recipe's width, the check before anything is
    written, the load of the encoder."""
    from attnlab.checkpoints import build_encoder
    from attnlab.train.run_checks import check_run
    from attnlab.train.run_config import resolve_run_config

    config = resolve_run_config(None, [f'model.pretrained="{bert_dir}"', "data.max_length=16"])
    assert config.train.learning_rate == 1e-4  # width 16: the compact encoders' rate
    check_run(config, None)
    build_encoder(0, pretrained=str(bert_dir))
    assert reads.through_reader == reads.opened == [str(bert_dir / "config.json")] * 3
