import json

import pytest
import torch

from attnlab.models import TransformerEncoder
from attnlab.checkpoints import load_model, save_model
from attnlab.models import EncoderClassifier, EncoderForMaskedLM
from attnlab.train.checkpoint import save_checkpoint


def tiny_encoder(**options):
    torch.manual_seed(0)
    return TransformerEncoder(40, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0, pad_id=0, **options)


def test_masked_mean_pooling_ignores_padding():
    model = EncoderClassifier(tiny_encoder(), 3, pooling="mean").eval()
    short = model(torch.tensor([[2, 7, 8, 3]]))
    padded = model(torch.tensor([[2, 7, 8, 3, 0, 0]]))
    torch.testing.assert_close(short.logits, padded.logits, atol=1e-5, rtol=1e-5)
    assert short.loss is None and short.attentions is None


def test_first_token_pooling_and_outputs():
    model = EncoderClassifier(tiny_encoder(), 2, pooling="first").eval()
    ids = torch.tensor([[2, 7, 3, 0], [2, 9, 9, 3]])
    out = model(ids, ids != 0, output_attentions=True, labels=torch.tensor([0, 1]))
    assert out.logits.shape == (2, 2) and out.loss.ndim == 0
    assert out.attentions["layer_2"].shape == (2, 2, 4, 4)
    torch.testing.assert_close(out.logits, model.classifier(out.last_hidden_state[:, 0]))


def test_head_mask_reaches_the_encoder():
    model = EncoderClassifier(tiny_encoder(), 2).eval()
    ids = torch.tensor([[2, 7, 8, 3]])
    assert not torch.equal(model(ids).logits, model(ids, head_mask=torch.tensor([1.0, 0.0])).logits)


def test_masked_lm_ties_weights_and_ignores_unlabelled():
    model = EncoderForMaskedLM(tiny_encoder())
    assert model.decoder.weight is model.encoder.embedding.weight
    ids = torch.tensor([[2, 7, 8, 3]])
    model.eval()
    full = model(ids).logits
    assert full.shape == (1, 4, 40)
    out = model(ids, labels=torch.tensor([[-100, 7, -100, 9]]))
    assert out.logits.shape == (2, 40)  # the labelled positions only
    torch.testing.assert_close(out.logits, full[0, [1, 3]])
    expected = torch.nn.functional.cross_entropy(full[0, [1, 3]], torch.tensor([7, 9]))
    torch.testing.assert_close(out.loss, expected)
    assert model(ids, labels=torch.full((1, 4), -100)).loss.item() == 0.0


@pytest.mark.parametrize("kind", ["classifier", "masked_lm", "encoder"])
def test_save_and_load_round_trip(tmp_path, kind):
    encoder = tiny_encoder()
    model = {"classifier": lambda: EncoderClassifier(encoder, 2, label_names=["neg", "pos"]),
             "masked_lm": lambda: EncoderForMaskedLM(encoder), "encoder": lambda: encoder}[kind]().eval()
    save_model(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert set(config) == {"model_type", "encoder", "head"} and config["encoder"]["d_model"] == 16
    loaded = load_model(tmp_path)
    assert not loaded.model.training and loaded.tokenizer is None
    ids = torch.tensor([[2, 7, 8, 3, 0]])
    out, again = model(ids, output_attentions=True), loaded.model(ids, output_attentions=True)
    assert torch.equal(out[0], again[0])  # last_hidden_state, or the logits of a task head
    assert set(again.attentions.keys()) == {"layer_1", "layer_2"}
    if kind == "masked_lm":
        assert loaded.model.decoder.weight is loaded.model.encoder.embedding.weight


def test_load_model_from_run_directory_finds_best_and_tokenizer(tmp_path):
    from attnlab.data import train_tokenizer

    tokenizer = train_tokenizer(["a b c d"] * 3, vocab_size=30, min_frequency=1)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    model = EncoderClassifier(tiny_encoder(), 2)
    save_checkpoint(tmp_path / "checkpoints" / "last", model, {"step": 1})
    assert load_model(tmp_path).tokenizer.get_vocab_size() == tokenizer.get_vocab_size()
    with torch.no_grad():
        model.classifier.bias.fill_(3.0)
    save_checkpoint(tmp_path / "checkpoints" / "best", model, {"step": 2})
    assert load_model(tmp_path).model.classifier.bias.tolist() == [3.0, 3.0]
    assert load_model(tmp_path / "checkpoints" / "last").tokenizer is not None


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        load_model(tmp_path)


def test_pretrained_encoder_and_tokenizer_build():
    from attnlab.checkpoints import build_encoder, load_pretrained_tokenizer

    encoder = build_encoder(0, pretrained="minilm", dropout=0.2, attention_dropout=0.0)
    # the run's dropouts apply to the checkpoint's architecture
    assert encoder.config.dropout == 0.2 and encoder.config.effective_attention_dropout == 0.0
    assert encoder.config.num_layers == 6 and encoder.config.d_model == 384
    tokenizer = load_pretrained_tokenizer("minilm")
    ids = torch.tensor([tokenizer.encode("a fine film").ids])
    model = EncoderClassifier(encoder, 2).eval()
    assert model(ids).logits.shape == (1, 2)


def test_a_pretrained_directory_is_not_taken_for_a_checkpoint(tmp_path):
    import json

    from attnlab.checkpoints.attnlab_layout import find_checkpoint_dir

    pretrained = tmp_path / "bert"
    pretrained.mkdir()
    (pretrained / "model.safetensors").write_bytes(b"")
    (pretrained / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    assert find_checkpoint_dir(pretrained) is None
    run = tmp_path / "run"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "checkpoints" / "last" / "model.safetensors").write_bytes(b"")
    assert find_checkpoint_dir(run) == run / "checkpoints" / "last"
    assert find_checkpoint_dir(tmp_path) is None
