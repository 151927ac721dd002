"""One protocol builds every model from a config: ``Class.from_config(config, *, device=None, dtype=None)``.

It takes the class's config dataclass, that dataclass's dict, or the ``config.json`` dict
attnlab writes for the model (``model_config``); ``build_model`` hands that dict to the class
its ``model_type`` names; ``ImageTextModel.from_model_config`` is an alias.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab import EncoderClassifier, EncoderConfig, EncoderForMaskedLM, TransformerEncoder
from attnlab.checkpoints import build_model, model_config
from attnlab.checkpoints.encoders.loading import bert_style_config
from attnlab.models.decoder import DecoderConfig, DecoderForCausalLM
from attnlab.models.image_text import ImageTextConfig, ImageTextModel


def _encoder() -> TransformerEncoder:
    return TransformerEncoder.from_config(bert_style_config(40, 16, 1, 2, 32, max_len=24, pad_id=0))


def _models() -> list[nn.Module]:
    decoder = DecoderConfig(vocab_size=50, d_model=16, num_layers=1, num_heads=2, d_ff=32, num_kv_heads=1)
    image_text = ImageTextConfig(vocab_size=20, visual_dim=16, d_model=16, num_heads=2, d_ff=32, visual_layers=1,
                                 text_layers=1, cross_layers=1, dropout=0.0)
    return [
        _encoder(),
        EncoderClassifier(_encoder(), 3, pooling="first", label_names=["a", "b", "c"]),
        EncoderForMaskedLM(_encoder()),
        DecoderForCausalLM(decoder),
        ImageTextModel(image_text),
    ]


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("index", range(5))
def test_every_model_class_builds_from_its_config_json_dict(index: int) -> None:
    model = _models()[index]
    config = model_config(model)
    built = type(model).from_config(config)
    assert type(built) is type(model)
    assert model_config(built) == config
    assert _shapes(built) == _shapes(model)
    assert type(build_model(config)) is type(model) and model_config(build_model(config)) == config


def test_from_config_takes_the_config_dataclass_and_its_dict() -> None:
    encoder = _encoder()
    for config in (encoder.config, encoder.config.to_dict()):
        assert TransformerEncoder.from_config(config).config == encoder.config
    decoder = _models()[3]
    for config in (decoder.config, decoder.config.to_dict()):
        assert DecoderForCausalLM.from_config(config).config == decoder.config
    image_text = _models()[4]
    for config in (image_text.config, image_text.config.to_dict()):
        assert ImageTextModel.from_config(config).config == image_text.config
    assert ImageTextModel.from_model_config(model_config(image_text)).config == image_text.config


def test_a_task_model_takes_an_encoder_built_already() -> None:
    encoder = _encoder()
    config = model_config(EncoderClassifier(encoder, 2))
    built = EncoderClassifier.from_config(config, encoder=encoder)
    assert built.encoder is encoder


def test_device_and_dtype_reach_the_parameters() -> None:
    model = EncoderClassifier.from_config(model_config(EncoderClassifier(_encoder(), 2)), dtype=torch.bfloat16)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}


def test_bad_configs_are_named() -> None:
    with pytest.raises(TypeError, match="TransformerEncoder.from_config takes config: EncoderConfig, its dict"):
        TransformerEncoder.from_config([1, 2])
    with pytest.raises(ValueError, match="model_type is 'encoder_masked_lm'; EncoderClassifier.from_config builds"):
        EncoderClassifier.from_config(model_config(EncoderForMaskedLM(_encoder())))
    pretrained = {**model_config(_encoder()), "pretrained_config": {"model_type": "bert"}}
    with pytest.raises(ValueError, match="pretrained family's 'pretrained_config'.*build_model"):
        TransformerEncoder.from_config(pretrained)
    assert isinstance(EncoderConfig.from_dict(pretrained["encoder"]), EncoderConfig)
