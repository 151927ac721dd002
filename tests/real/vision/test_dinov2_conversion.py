"""The converted backbone computes what the ONNX graph computes: every hidden state and the last
layer's attention of a real picture, against ``onnx.reference.ReferenceEvaluator`` on the graph."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from convert_dinov2 import read_graph

pytestmark = pytest.mark.slow


def _backbone(graph, outputs: list[str]):
    """The graph cut to the nodes ``outputs`` need (the saliency decoder left out), with those
    intermediate values as its outputs."""
    import onnx.helper as helper

    needed, kept = set(outputs), []
    for node in reversed(graph.graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(name for name in node.input if name)
    kept.reverse()
    body = helper.make_graph(kept, "backbone", list(graph.graph.input),
                             [helper.make_empty_tensor_value_info(name) for name in outputs],
                             [tensor for tensor in graph.graph.initializer if tensor.name in needed])
    return helper.make_model(body, opset_imports=graph.opset_import)


def test_hidden_states_and_attention_equal_the_onnx_graphs(dinov2, dinov2_dir, skimage_data):
    from onnx.reference import ReferenceEvaluator
    from PIL import Image

    from attnlab.data.images import read_image_preprocessing

    graph = read_graph()
    layers = dinov2.config.num_hidden_layers
    outputs = (["/backbone/embeddings/Add_output_0"]
               + [f"/backbone/encoder/layer.{k}/Add_1_output_0" for k in range(layers)]
               + ["/backbone/layernorm/Add_1_output_0",
                  f"/backbone/encoder/layer.{layers - 1}/attention/attention/Softmax_output_0"])
    with Image.open(skimage_data / "astronaut.png") as picture:
        pixels = read_image_preprocessing(dinov2_dir)(picture.convert("RGB"))  # [1, 3, 224, 224]
    found = ReferenceEvaluator(_backbone(graph, outputs)).run(None, {"input_image": pixels.numpy()})
    with torch.no_grad():
        ours = dinov2(pixel_values=pixels, output_hidden_states=True, output_attentions=True)
    expected = [*ours.hidden_states, ours.last_hidden_state, ours.attentions[-1]]
    assert len(found) == len(expected) == layers + 3
    for index, (reference, value) in enumerate(zip(found, expected)):
        value = value.numpy()
        assert value.shape == reference.shape, index
        # float32 through 12 layers: the two differ by rounding only (measured 4e-5 at a scale of 27)
        scale = float(np.abs(reference).max())
        assert float(np.abs(value - reference).max()) <= 1e-5 * max(1.0, scale), index


def test_the_position_table_is_the_518_pixel_grid_interpolated_bicubically(dinov2_dir):
    from onnx import helper

    graph = read_graph()
    config = json.loads((dinov2_dir / "config.json").read_text())
    assert (config["image_size"], config["patch_size"]) == (518, 14)  # a 37 x 37 table
    resize = next(node for node in graph.graph.node if node.name == "/backbone/embeddings/Resize")
    settings = {attribute.name: helper.get_attribute_value(attribute) for attribute in resize.attribute}
    # what torch.nn.functional.interpolate(mode="bicubic", align_corners=False) is, and what
    # transformers' Dinov2Embeddings.interpolate_pos_encoding calls
    assert settings["mode"] == b"cubic" and settings["cubic_coeff_a"] == pytest.approx(-0.75)
    assert settings["coordinate_transformation_mode"] == b"half_pixel"
    processor = json.loads((dinov2_dir / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 224, "width": 224}
    assert processor["image_mean"] == [0.485, 0.456, 0.406] and processor["image_std"] == [0.229, 0.224, 0.225]
