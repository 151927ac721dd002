"""A decoder saved with ``save_pretrained`` in attnlab's layout opens again, identical; what
cannot be written is refused in one line, before anything is written."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import attnlab
from attnlab import TransformerEncoder, prune_heads
from attnlab.data import Tokenizer, train_tokenizer
from attnlab.models.decoder import DecoderConfig, DecoderForCausalLM
from attnlab.checkpoints.encoders.loading import UnsupportedCheckpointError

LLAMA_LIKE = DecoderConfig(vocab_size=60, d_model=32, num_layers=2, num_heads=4, d_ff=48, num_kv_heads=2,
                           max_len=64, eos_id=1, rope_scaling={"rope_type": "linear", "factor": 2.0})
GPT2_LIKE = DecoderConfig(vocab_size=60, d_model=32, num_layers=2, num_heads=4, d_ff=48, max_len=64,
                          norm="layer", norm_eps=1e-5, feed_forward="plain", activation="gelu_tanh",
                          position="learned", qkv_bias=True, out_bias=True, ffn_bias=True, eos_id=1)


def _decoder(config: DecoderConfig) -> DecoderForCausalLM:
    torch.manual_seed(0)
    return DecoderForCausalLM(dataclasses.replace(config)).eval()


@pytest.mark.parametrize("config", [LLAMA_LIKE, dataclasses.replace(LLAMA_LIKE, tie_embeddings=False),
                                    GPT2_LIKE, dataclasses.replace(GPT2_LIKE, tie_embeddings=False)],
                         ids=["llama-tied", "llama-untied", "gpt2-tied", "gpt2-untied"])
def test_attnlab_layout_reopens_the_same_decoder(config, tmp_path):
    model = _decoder(config)
    directory = model.save_pretrained(tmp_path / "saved")
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "model.safetensors"]
    loaded = attnlab.load(directory)
    again = DecoderForCausalLM.from_pretrained(directory)
    ids = torch.randint(2, 60, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        for other in (loaded.model, again):
            assert isinstance(other, DecoderForCausalLM) and not other.training
            assert other.config == model.config
            assert torch.equal(other(ids).logits, expected)
            assert (other.lm_head.weight is other.embed_tokens.weight) == config.tie_embeddings
    generated = model.generate(ids[:1, :4], max_new_tokens=6).sequences
    assert torch.equal(again.generate(ids[:1, :4], max_new_tokens=6).sequences, generated)
    assert loaded.config["model_type"] == "decoder" and loaded.tokenizer is None


def test_a_fine_tuned_decoder_saves_its_new_weights_and_its_tokenizer(tmp_path):
    model = _decoder(LLAMA_LIKE).train()
    ids = torch.randint(2, 60, (2, 9))
    torch.optim.SGD(model.parameters(), lr=0.5).zero_grad()
    model(ids, labels=ids).loss.backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter -= 0.5 * parameter.grad
    model.eval()
    backend = train_tokenizer(["the film is a quiet triumph", "dull"] * 20, vocab_size=60, kind="bpe")
    model.save_pretrained(tmp_path / "tuned", tokenizer=Tokenizer(backend))
    loaded = attnlab.load(tmp_path / "tuned")
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)
    assert isinstance(loaded.tokenizer, Tokenizer) and loaded.tokenizer.padding_side == "left"
    assert loaded.tokenizer.pad_token == backend.id_to_token(LLAMA_LIKE.eos_id)  # no pad id: EOS pads


def test_saving_into_an_existing_directory_replaces_only_the_files_it_writes(tmp_path):
    directory = tmp_path / "existing"
    directory.mkdir()
    (directory / "notes.txt").write_text("mine")
    _decoder(GPT2_LIKE).save_pretrained(directory)
    model = _decoder(LLAMA_LIKE)
    with pytest.raises(ValueError, match=r"existing/config\.json already exists; pass overwrite=True"):
        model.save_pretrained(directory)
    model.save_pretrained(directory, overwrite=True)  # as encoders do: same names replaced, other files left alone
    assert (directory / "notes.txt").read_text() == "mine"
    assert attnlab.load(directory).model.config == model.config


def test_unknown_layout_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"^layout must be 'attnlab' or 'huggingface', got 'onnx'$"):
        _decoder(LLAMA_LIKE).save_pretrained(tmp_path / "x", layout="onnx")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("config, message", [
    (dataclasses.replace(LLAMA_LIKE, norm="layer", norm_eps=1e-5),
     r"^this decoder cannot be written as llama: norm='layer' \(llama: 'rms'\)$"),
    (dataclasses.replace(GPT2_LIKE, num_kv_heads=2),
     r"^this decoder cannot be written as GPT-2: num_kv_heads=2 \(GPT-2 has one key and value per head\)$"),
    (dataclasses.replace(LLAMA_LIKE, sliding_window=8, qkv_bias=True),
     r"^this decoder cannot be written as mistral: qkv_bias=True \(mistral: False\)$"),
], ids=["layer-norm-rotary", "gpt2-grouped-query", "sliding-window-with-biases"])
def test_a_decoder_no_huggingface_family_expresses_is_refused_in_one_line(config, message, tmp_path):
    with pytest.raises(UnsupportedCheckpointError, match=message):
        _decoder(config).save_pretrained(tmp_path / "x", layout="huggingface")
    assert not (tmp_path / "x").exists()


def test_a_family_without_a_huggingface_writer_is_named(tmp_path):
    model = _decoder(LLAMA_LIKE)
    model.checkpoint_config = {"model_type": "phi3"}
    with pytest.raises(UnsupportedCheckpointError, match=r"^no HuggingFace writer for model_type 'phi3'; "
                                                         r"attnlab writes gpt2, llama, mistral, qwen2$"):
        model.save_pretrained(tmp_path / "x", layout="huggingface")


@pytest.mark.parametrize("layout", ["attnlab", "huggingface"])
def test_weights_that_no_longer_fit_the_config_are_refused(layout, tmp_path):
    resized = _decoder(LLAMA_LIKE)
    resized.embed_tokens = nn.Embedding(70, 32)  # grown vocabulary, config not updated
    with pytest.raises(ValueError, match=r"no longer fits its config.*embed_tokens.weight is \(70, 32\), its "
                                         r"config builds \(60, 32\)"):
        resized.save_pretrained(tmp_path / "x", layout=layout)
    untied = _decoder(LLAMA_LIKE)
    untied.lm_head.weight = nn.Parameter(untied.lm_head.weight.detach().clone())
    with pytest.raises(ValueError, match="config.tie_embeddings is True but the LM head is apart from"):
        untied.save_pretrained(tmp_path / "x", layout=layout)
    assert not (tmp_path / "x").exists()


def test_a_decoder_checkpoint_opens_as_a_decoder_only(tmp_path):
    _decoder(LLAMA_LIKE).save_pretrained(tmp_path / "saved")
    with pytest.raises(TypeError, match=r"holds a DecoderForCausalLM, not a TransformerEncoder"):
        TransformerEncoder.from_pretrained(tmp_path / "saved")
    with pytest.raises(UnsupportedCheckpointError,
                       match=r"is an attnlab checkpoint \(model_type 'decoder'\)"):
        attnlab.from_pretrained(tmp_path / "saved")


def test_head_pruning_is_for_encoders_so_a_decoder_has_no_pruned_state_to_save():
    with pytest.raises(TypeError, match="prune_heads takes an attnlab TransformerEncoder"):
        prune_heads(_decoder(LLAMA_LIKE), {"layer_1": [0]})
