"""An image model in the explorer: upload a picture, see per-head overlays and the rollout,
switch a head off and see the labels change as the library's head mask computes."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from attnlab.inspect.compute.heads import mask_heads
from attnlab.serve.limits import ServeLimits
from attnlab.serve.session import open_session

from conftest import RunningServer, create_app

transformers = pytest.importorskip("transformers", reason="image models open through transformers")
Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=64, num_labels=3,
                                    id2label={0: "circle", 1: "square", 2: "line"},
                                    label2id={"circle": 0, "square": 1, "line": 2})
    transformers.ViTForImageClassification(config).eval().save_pretrained(directory)
    session = open_session(str(directory), limits=ServeLimits(max_image_pixels=256 * 256))
    server = RunningServer(create_app(session))
    yield server, session
    server.stop()


def _png(size=(40, 40), kind="PNG") -> bytes:
    picture = Image.fromarray((np.random.default_rng(0).random((size[1], size[0], 3)) * 255).astype(np.uint8))
    buffer = io.BytesIO()
    picture.save(buffer, format=kind)
    return buffer.getvalue()


def test_an_upload_gives_overlays_rollout_and_labels_and_a_head_switched_off_moves_them(image_server) -> None:
    server, session = image_server
    status, info = server.request("api/info")
    assert status == 200 and info["kind"] == "image" and info["heads"] == [4, 4]
    status, view = server.request("api/image", raw=_png())
    assert status == 200, view
    assert view["grid"] == [4, 4] and view["prefix"] == 1 and view["shape"] == [2, 4, 4, 4]
    assert len(base64.b64decode(view["maps"])) == 2 * 4 * 16 * 2 and len(base64.b64decode(view["rollout"])) == 16 * 2
    assert [entry["token"] for entry in view["prediction"]["top"]] != []
    status, off = server.request("api/image?off=2:1,2:3", raw=_png())
    assert status == 200 and off["off"] == ["2:1", "2:3"]
    explorer = session.explorer
    pixels = explorer.steps(Image.open(io.BytesIO(_png())).convert("RGB"))
    with torch.no_grad(), mask_heads(explorer.model, {explorer.layers[1]: [0, 2]}):
        expected = torch.softmax(explorer.inner(pixel_values=pixels).logits[0], -1)
    for entry in off["prediction"]["top"]:
        assert entry["probability"] == pytest.approx(float(expected[entry["id"]]), abs=2e-5)
    assert off["prediction"] != view["prediction"]


@pytest.mark.parametrize("raw, status, message", [
    (b"", 400, "no image"),
    (b"not an image at all", 400, "not an image"),
    (_png(kind="GIF"), 415, "PNG or JPEG"),
    (_png(size=(300, 300)), 413, "pixels"),
])
def test_a_bad_upload_gets_its_error(image_server, raw, status, message) -> None:
    server, _ = image_server
    got, answer = server.request("api/image", raw=raw)
    assert got == status and message in answer["error"]
    assert server.request("api/view", {"text": "a"})[0] == 422  # text goes elsewhere; still serving
    assert server.request("api/image", raw=_png())[0] == 200
