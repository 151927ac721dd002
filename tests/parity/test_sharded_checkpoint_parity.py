"""Sharded checkpoints and the load dtype, against ``transformers``.

Tiny random models are made by ``transformers`` at test time and written with
``save_pretrained(max_shard_size=...)`` into several ``model-0000k-of-0000n.safetensors``
shards and a ``model.safetensors.index.json``; ``attnlab.load`` opens them and must
compute what HuggingFace's eager attention computes (1e-5 in float32, as in
``test_family_parity.py`` and ``test_decoder_parity.py``). Then the dtype: bfloat16 and
float16 loading keep those dtypes (bit for bit what the file holds) and compute as
accurately as HuggingFace does in them (against a float64 run), ``"auto"`` takes the
checkpoint's own.
"""

from __future__ import annotations

import json

import pytest
import torch

import attnlab
from attnlab import EncoderForMaskedLM, TransformerEncoder
from attnlab.models.decoder import DecoderForCausalLM

transformers = pytest.importorskip(
    "transformers", reason="parity with HuggingFace needs transformers (pip install -e '.[dev]')"
)

TOLERANCE = 1e-5
VOCAB = 99
SHARD = "20KB"  # every model below is 50-200 KB: several shards each


def _perturbed(model):
    """Spread HF's small initial weights so that attention is far from uniform."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.2)
    return model.eval()


def _save_sharded(model, directory, **options):
    model.save_pretrained(directory, max_shard_size=SHARD, **options)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 3 and not (directory / "model.safetensors").exists(), shards
    return directory


def _bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                     pad_token_id=0)
    torch.manual_seed(0)
    return _perturbed(transformers.BertModel(config))


def _llama(**extra):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80,
                                      num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2,
                                      max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0, **extra)
    torch.manual_seed(0)
    return _perturbed(transformers.LlamaForCausalLM(config))


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=3, n_head=4, n_positions=128,
                                     bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return _perturbed(transformers.GPT2LMHeadModel(config))


def _ids_and_mask():
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    return ids, mask


def _assert_attentions_match(ours, theirs, tolerance=TOLERANCE):
    assert len(ours) == len(theirs)
    for layer, (mine, reference) in enumerate(zip(ours, theirs), start=1):
        torch.testing.assert_close(mine, reference, atol=tolerance, rtol=0, msg=f"layer {layer}")


def test_a_sharded_bert_encoder_opens_at_parity(tmp_path):
    hf = _bert()
    directory = _save_sharded(hf, tmp_path / "bert")
    model, _, config = attnlab.load(directory)
    assert isinstance(model, TransformerEncoder) and config["model_type"] == "bert"
    ids, mask = _ids_and_mask()
    with torch.no_grad():
        expected = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()(
            ids, attention_mask=mask, output_attentions=True)
        ours = model(ids, mask.bool(), output_attentions=True)
    torch.testing.assert_close(ours.last_hidden_state, expected.last_hidden_state, atol=TOLERANCE, rtol=0)
    _assert_attentions_match(ours.attentions, expected.attentions)


def test_a_sharded_masked_lm_keeps_its_tied_decoder(tmp_path):
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=37,
                                        max_position_embeddings=64, pad_token_id=1, type_vocab_size=1)
    torch.manual_seed(0)
    hf = _perturbed(transformers.RobertaForMaskedLM(config))
    directory = _save_sharded(hf, tmp_path / "roberta")
    model = attnlab.load(directory).model
    assert isinstance(model, EncoderForMaskedLM)
    assert model.decoder.weight is model.encoder.embedding.weight
    ids, mask = _ids_and_mask()
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        ours = model(ids, mask.bool()).logits
    torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_sharded_decoder_opens_at_parity(family, tmp_path):
    hf = _llama() if family == "llama" else _gpt2()
    directory = _save_sharded(hf, tmp_path / family)
    model = attnlab.load(directory).model
    assert isinstance(model, DecoderForCausalLM)
    hf = type(hf).from_pretrained(directory, attn_implementation="eager").eval()
    ids, mask = _ids_and_mask()
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask, output_attentions=True)
        ours = model(ids, mask, output_attentions=True)
    torch.testing.assert_close(ours.logits, expected.logits, atol=TOLERANCE, rtol=0)
    _assert_attentions_match(ours.attentions, expected.attentions)


def _llama_weights(model: DecoderForCausalLM) -> dict[str, torch.Tensor]:
    """attnlab's decoder tensors under HuggingFace's names (q, k, v split apart)."""
    from attnlab.checkpoints.decoders._llama_layout import decoder_state_to_llama

    return decoder_state_to_llama(model.state_dict(), model.config)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_loading_keeps_the_files_values_and_auto_reads_the_checkpoints_dtype(dtype, tmp_path):
    hf = _llama().to(dtype)
    directory = _save_sharded(hf, tmp_path / "half")
    stored = {name: tensor for name, tensor in hf.state_dict().items()}
    name = str(dtype).removeprefix("torch.")
    for requested in (name, dtype, "auto"):
        model = attnlab.load(directory, dtype=requested).model
        assert {parameter.dtype for parameter in model.parameters()} == {dtype}, requested
        for hf_name, tensor in _llama_weights(model).items():
            assert torch.equal(tensor, stored[hf_name]), hf_name  # the file's values, never rounded twice
    ids, _ = _ids_and_mask()
    hf_class = type(hf)
    with torch.no_grad():
        logits = model(ids).logits
        golden = hf_class.from_pretrained(directory, dtype=torch.float64).eval()(ids).logits
        hf_half = hf_class.from_pretrained(directory, dtype=dtype, attn_implementation="eager").eval()
        hf_half = hf_half(ids).logits
    assert logits.dtype == dtype
    # as accurate as HuggingFace's own run in that dtype, within a factor of 2, against float64
    error, hf_error = ((values.double() - golden).abs().max() for values in (logits, hf_half))
    assert error <= 2 * hf_error, (error, hf_error)


def test_float32_is_the_default_and_auto_keeps_a_float32_checkpoint_in_float32(tmp_path):
    hf = _gpt2()
    directory = _save_sharded(hf, tmp_path / "gpt2")
    assert {parameter.dtype for parameter in attnlab.load(directory).model.parameters()} == {torch.float32}
    assert {parameter.dtype for parameter in attnlab.load(directory, dtype="auto").model.parameters()} == {
        torch.float32}
    half = attnlab.load(directory, dtype="bfloat16").model
    assert {parameter.dtype for parameter in half.parameters()} == {torch.bfloat16}


def test_an_encoder_in_bfloat16_from_a_float32_checkpoint(tmp_path):
    hf = _bert()
    directory = _save_sharded(hf, tmp_path / "bert")
    model = attnlab.load(directory, dtype="bfloat16").model
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.embedding.weight, hf.embeddings.word_embeddings.weight.to(torch.bfloat16))
    ids, mask = _ids_and_mask()
    with torch.no_grad():
        hidden = model(ids, mask.bool()).last_hidden_state
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden).all()
