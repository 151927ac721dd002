"""ImageTextModel: patches, shapes, both fusions, masks, gates."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.image_text import ImageTextConfig, ImageTextModel, PatchEmbedding, gate_summary


def _config(**overrides) -> ImageTextConfig:
    values = dict(vocab_size=20, visual_dim=16, d_model=16, num_heads=2, d_ff=32, visual_layers=1,
                  text_layers=1, cross_layers=2, dropout=0.0)
    return ImageTextConfig(**{**values, **overrides})


def _batch():
    input_ids = torch.tensor([[2, 5, 6, 7], [2, 8, 0, 0]])
    images = torch.rand(2, 8, 8, generator=torch.Generator().manual_seed(0))
    return input_ids, images


def test_patches_are_cut_row_major():
    embedding = PatchEmbedding(8, 2, 4)
    image = torch.arange(64.0).view(1, 8, 8)
    patches = embedding.patches(image)  # [1, 16, 4]
    assert patches.shape == (1, 16, 4)
    assert patches[0, 0].tolist() == [0, 1, 8, 9]
    assert patches[0, 1].tolist() == [2, 3, 10, 11]
    assert patches[0, 4].tolist() == [16, 17, 24, 25]


def test_two_dimensional_positions_differ_per_patch():
    embedding = PatchEmbedding(8, 4, 8)
    out = embedding(torch.zeros(1, 8, 8))  # same (empty) content everywhere
    assert torch.unique(out[0], dim=0).shape[0] == 4


@pytest.mark.parametrize("gate", ["sigmoid", "tanh0"])
def test_cross_attention_model_shapes(gate):
    torch.manual_seed(0)
    model = ImageTextModel(_config(gate=gate)).eval()
    input_ids, images = _batch()
    out = model(input_ids, images=images, output_attentions=True)
    assert out.logits.shape == (2, 2)
    assert out.attentions["layer_1"].shape == (2, 2, 4, 4)
    assert out.visual_attentions["layer_1"].shape == (2, 2, 16, 16)
    assert set(out.cross_attentions.keys()) == {"layer_1", "layer_2"}
    assert out.cross_attentions["layer_2"].shape == (2, 2, 4, 16)
    assert out.visual_to_text_attentions["layer_1"].shape == (2, 2, 16, 4)
    # patches never attend to padding tokens
    assert torch.all(out.visual_to_text_attentions["layer_1"][1, :, :, 2:] == 0)
    assert set(gate_summary(out.gates)) == {"gate/layer_1", "gate/layer_2"}


def test_concat_baseline_has_no_cross_attention():
    model = ImageTextModel(_config(fusion="concat")).eval()
    input_ids, images = _batch()
    out = model(input_ids, images=images, output_attentions=True)
    assert out.logits.shape == (2, 2)
    assert out.cross_attentions is None and out.gates == {}
    assert len(model.cross_layers) == 0


def test_padding_does_not_change_the_prediction():
    model = ImageTextModel(_config()).eval()
    input_ids, images = _batch()
    short = model(input_ids[1:, :2], images=images[1:]).logits
    padded = model(input_ids[1:], images=images[1:]).logits
    torch.testing.assert_close(short, padded)


def test_a_fully_masked_image_gives_finite_logits_and_gradients():
    model = ImageTextModel(_config())
    input_ids, images = _batch()
    out = model(input_ids, images=images, image_mask=torch.zeros(2, 16, dtype=torch.bool))
    assert torch.isfinite(out.logits).all()
    out.logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_answer_depends_on_the_image():
    torch.manual_seed(0)
    model = ImageTextModel(_config()).eval()
    input_ids, images = _batch()
    first = model(input_ids, images=images).logits
    second = model(input_ids, images=images.flip(-1)).logits
    assert not torch.allclose(first, second)


def test_config_round_trip_and_validation():
    config = _config(gate="tanh0")
    assert ImageTextConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="patch_size"):
        _config(patch_size=3)
    with pytest.raises(ValueError, match="fusion"):
        _config(fusion="sum")
    with pytest.raises(ValueError, match="unknown"):
        ImageTextConfig.from_dict({"vocab_size": 3, "colour": 1})
    with pytest.raises(ValueError, match="images"):
        ImageTextModel(_config())(torch.tensor([[2, 3]]), images=torch.rand(1, 7, 7))


def test_image_index_shares_one_image_encoding_between_statements():
    torch.manual_seed(0)
    model = ImageTextModel(_config()).eval()
    input_ids, images = _batch()
    repeated = model(input_ids, images=images[[1, 1]]).logits
    shared = model(input_ids, images=images[1:], image_index=torch.tensor([0, 0])).logits
    torch.testing.assert_close(shared, repeated)
    with pytest.raises(ValueError, match="image_index"):
        model(input_ids, images=images[1:], image_index=torch.tensor([0, 1]))


def test_labels_give_the_mean_cross_entropy():
    model = ImageTextModel(_config()).eval()
    input_ids, images = _batch()
    labels = torch.tensor([1, 0])
    out = model(input_ids, images=images, labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))
    assert model(input_ids, images=images).loss is None


def test_save_and_load_round_trip(tmp_path):
    from attnlab.checkpoints import load_model, save_model

    model = ImageTextModel(_config(gate="tanh0")).eval()
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded.model, ImageTextModel) and loaded.config["model_type"] == "image_text"
    input_ids, images = _batch()
    torch.testing.assert_close(loaded.model(input_ids, images=images).logits, model(input_ids, images=images).logits)
