"""What the real DINOv2-small does, measured: its class token looks at the object, a random
model of the same shape does not, and it shows no artifact token (a planted one is found).

Margins from the measurements (``measure_object_attention.py``, the horse on three textures at
two places and two sizes): the real model's heads-mean share of the horse is 3.7 to 7.7 times
its share of the area and the rollout's 1.7 to 2.9 times; a random ``Dinov2Model`` stays within
1.05 times. The largest patch norm of the real model is at most 1.45 times the median on
scikit-image's photographs and 1.12 times on the scenes.
"""

from __future__ import annotations

import json

import pytest
import torch

from measure_object_attention import measure, scenes
from scenes import skimage_folder

pytestmark = pytest.mark.slow

FUSED_MARGIN = 2.5  # the heads' mean puts at least 2.5 x the area share on the object
ROLLOUT_MARGIN = 1.5


def _looks_at_the_object(share) -> bool:
    return share.fused >= FUSED_MARGIN * share.area and share.rollout >= ROLLOUT_MARGIN * share.area


@pytest.fixture(scope="module")
def grass_scenes(skimage_data):
    return scenes(textures=("grass",))  # two places x two sizes


@pytest.fixture(scope="module")
def preprocessing(dinov2_dir):
    from attnlab.data.images import read_image_preprocessing

    return read_image_preprocessing(dinov2_dir)


def test_the_real_class_token_puts_clearly_more_than_the_area_share_on_the_object(dinov2, preprocessing,
                                                                                   grass_scenes):
    for scene in grass_scenes:
        share, _ = measure(dinov2, preprocessing, scene)
        assert 0.03 < share.area < 0.15, scene.name
        assert _looks_at_the_object(share), (scene.name, share.as_dict())
        assert int((share.per_head > 2 * share.area).sum()) >= 4, (scene.name, share.per_head)  # of 6 heads


def test_a_random_model_of_the_same_config_fails_that_assertion(dinov2, preprocessing, grass_scenes):
    from transformers import Dinov2Model

    torch.manual_seed(0)
    random = Dinov2Model(dinov2.config).eval()
    for scene in grass_scenes:
        share, _ = measure(random, preprocessing, scene)
        assert not _looks_at_the_object(share), (scene.name, share.as_dict())
        assert share.fused == pytest.approx(share.area, rel=0.2)  # near even attention


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee"])
def test_dinov2_small_shows_no_artifact_token_on_photographs(dinov2, preprocessing, name):
    from attnlab.data.images import load_image
    from attnlab.hf.vision import image_attention

    seen = image_attention(dinov2, preprocessing(load_image(skimage_folder() / f"{name}.png")))
    assert seen.artifact_tokens() == []
    assert float(seen.patch_norms.max() / seen.patch_norms.median()) < 1.6  # measured at most 1.45


def test_no_artifact_token_on_the_scenes_and_a_planted_one_is_found(dinov2, preprocessing, grass_scenes):
    from attnlab.hf.vision import image_attention

    scene = grass_scenes[0]
    pixels = preprocessing(scene.image)
    assert image_attention(dinov2, pixels).artifact_tokens() == []
    row, column = 13, 2  # a grass patch, away from the horse in the upper left
    assert scene.mask[row * 14:(row + 1) * 14, column * 14:(column + 1) * 14].sum() == 0

    def plant(module, inputs, output):  # one patch's output of the last block made 4 times larger
        hidden = output[0] if isinstance(output, tuple) else output
        hidden[:, 1 + row * 16 + column] *= 4.0

    # (planted before the last block instead, the block's own large update drowns it: x 6 there
    # comes out 1.5 x the median)
    handle = dinov2.encoder.layer[-1].register_forward_hook(plant)
    try:
        found = image_attention(dinov2, pixels).artifact_tokens()
    finally:
        handle.remove()
    assert [(token.row, token.column) for token in found] == [(row, column)]
    assert found[0].norm_ratio > 3.0 and 0.0 <= found[0].attention <= 1.0


def test_inspect_on_the_real_backbone_writes_the_page_and_names_no_artifact(dinov2_dir, tmp_path, capsys):
    from attnlab.cli import main

    out = tmp_path / "chelsea"
    code = main(["inspect", "--model", str(dinov2_dir), "--image", str(skimage_folder() / "chelsea.png"),
                 "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "16 x 16 patches, 1 token(s) before them, 12 layers" in printed.out
    assert "artifact tokens (high-norm patches, row and column): none" in printed.out
    statistics = json.loads((out / "statistics.json").read_text())
    assert statistics["grid"] == [16, 16] and len(statistics["layers"]) == 12
    artifacts = statistics["artifact_tokens"]
    assert artifacts["tokens"] == [] and artifacts["norm_ratio"] == 2.0 and 1.0 < artifacts["largest_norm_ratio"] < 2.0
    page = (out / "report.html").read_text()
    assert "Artifact tokens" in page and "this image shows no artifact token" in page
    for name in ("layer_12.png", "rollout.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("arguments, message", [
    (["--image", "missing.png"], "no such file"),
    (["--image", "."], "is a folder"),
    (["--image", "notes.png"], "not an image Pillow can read"),
])
def test_bad_images_for_the_real_backbone_are_one_line(dinov2_dir, tmp_path, monkeypatch, capsys, arguments,
                                                      message):
    from attnlab.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.png").write_text("not a picture")
    assert main(["inspect", "--model", str(dinov2_dir), *arguments, "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
    assert not (tmp_path / "out").exists()
