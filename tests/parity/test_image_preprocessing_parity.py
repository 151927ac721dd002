"""A model directory's preprocessor_config.json, applied by attnlab, against transformers'
AutoImageProcessor on the same file (written in tmp_path; nothing is downloaded)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference is transformers' image processor")

from attnlab.hf.image_preprocessing import ImagePreprocessing, read_image_preprocessing  # noqa: E402
from attnlab.hf.vision import pixels_for  # noqa: E402

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
SETTINGS = {
    "vit": {"image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": 32, "width": 32},
            "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    "clip": {"image_processor_type": "CLIPImageProcessor", "do_resize": True, "size": {"shortest_edge": 40},
             "do_center_crop": True, "crop_size": {"height": 32, "width": 32}, "resample": 3, "do_rescale": True,
             "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
             "do_convert_rgb": True},
    "bit": {"image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 36},
            "do_center_crop": True, "crop_size": {"height": 24, "width": 32}, "resample": 3, "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.485, 0.456, 0.406],
            "image_std": [0.229, 0.224, 0.225], "do_convert_rgb": True},
    "crop past the image": {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                            "size": {"shortest_edge": 20}, "do_center_crop": True,
                            "crop_size": {"height": 27, "width": 27}, "resample": 2, "do_rescale": True,
                            "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": CLIP_MEAN,
                            "image_std": CLIP_STD},
    "no normalising": {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                       "size": {"height": 16, "width": 24}, "resample": 3, "do_rescale": True,
                       "rescale_factor": 1 / 255, "do_normalize": False},
}


def _image(height=45, width=70):
    from PIL import Image

    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _directory(tmp_path, name):
    directory = tmp_path / name.replace(" ", "-")
    directory.mkdir()
    (directory / "preprocessor_config.json").write_text(json.dumps(SETTINGS[name]))
    return directory


@pytest.mark.parametrize("name", list(SETTINGS))
@pytest.mark.parametrize("shape", [(45, 70), (70, 45)])
def test_pixels_equal_auto_image_processors(tmp_path, name, shape):
    directory = _directory(tmp_path, name)
    image = _image(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = transformers.AutoImageProcessor.from_pretrained(directory)
    want = torch.as_tensor(np.asarray(processor(images=image, return_tensors="np")["pixel_values"]))
    got = read_image_preprocessing(directory)(image)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=0)


def test_a_directory_without_the_file_gives_none_and_an_unknown_size_is_named(tmp_path):
    assert read_image_preprocessing(tmp_path) is None
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"longest_edge": 9}}))
    with pytest.raises(ValueError, match="size .*longest_edge.* expected"):
        read_image_preprocessing(tmp_path)


def test_pixels_for_takes_the_preprocessing_and_a_size_replaces_its_resize_and_crop(tmp_path):
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=4, intermediate_size=64)
    model = transformers.ViTModel(config)
    steps = read_image_preprocessing(_directory(tmp_path, "clip"))
    image = _image()
    assert torch.equal(pixels_for(model, image, preprocessing=steps), steps(image))
    resized = pixels_for(model, image, preprocessing=steps, size=(20, 50))  # cut to multiples of 8
    assert resized.shape == (1, 3, 16, 48)
    plain = pixels_for(model, image)  # no file: ViT's defaults at the model's size
    assert plain.shape == (1, 3, 32, 32)
    assert torch.equal(plain, ImagePreprocessing(size=(32, 32), resample=3)(image))
