"""What the explorer shows of an image model: the class token's attention over the patches per
layer and head, the rollout, and an image classifier's labels, with heads switched off.

Dimension letters: ``L`` layers, ``H`` heads, ``N`` tokens, ``gh x gw`` the patch grid.

The maps come from :func:`~attnlab.hf.vision.image_attention` (what ``attnlab inspect --image``
draws), the rollout from :func:`~attnlab.inspect.compute.rollout.attention_rollout` with the
same defaults (head fusion ``max``, discard ratio 0.9), the head mask from
:func:`~attnlab.inspect.compute.heads.mask_heads`. An upload is bounded in bytes and in
pixels (read from the header, before the image is decoded).
"""

from __future__ import annotations

import base64
import contextlib
import io
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..inspect.compute.capture import attention_heads, find_attention_modules
from ..inspect.compute.heads import mask_heads
from ..inspect.compute.rollout import attention_rollout
from .limits import RequestError, ServeLimits
from .text_views import pack_weights

__all__ = ["ImageExplorer", "is_image_model"]


def is_image_model(config: Any) -> bool:
    """Whether a ``config.json`` dict describes a model that reads pictures only (ViT, DeiT, DINOv2)."""
    if not isinstance(config, dict):
        return False
    text = "vocab_size" in config or "text_config" in config or "num_mel_bins" in config
    return not text and ("patch_size" in config or "image_size" in config)


class ImageExplorer:
    """The views of one vision transformer opened through transformers.

    Args:
        model: a :class:`~attnlab.hf.opening.TransformersModel` holding the vision model.
        preprocessing: the directory's image preprocessing (``None``: ViT's defaults).
        name: shown on the page.
        limits: the request bounds.
    """

    kind = "image"

    def __init__(self, model: nn.Module, preprocessing: Optional[Any], name: str, limits: ServeLimits) -> None:
        from ..hf.opening import transformers_module
        from ..hf.vision import image_steps

        self.model, self.name, self.limits = model.eval(), name, limits
        self.inner = transformers_module(model)
        self.steps = image_steps(self.inner, preprocessing=preprocessing)
        modules = find_attention_modules(model)
        self.layers = list(modules)
        self.heads = [attention_heads(module) or 1 for module in modules.values()]
        self.label_names = getattr(model, "label_names", None)
        self.classifier = self.label_names is not None and type(self.inner).__name__.endswith("ForImageClassification")

    def info(self) -> dict[str, Any]:
        return {"model": self.name, "kind": self.kind, "layers": len(self.layers), "heads": self.heads,
                "layer_names": self.layers, "methods": [], "labels": self.label_names,
                "max_image_bytes": self.limits.max_image_bytes, "max_image_pixels": self.limits.max_image_pixels,
                "can_patch": False}

    def read(self, data: bytes) -> Any:
        """An RGB ``PIL.Image`` from PNG or JPEG bytes, refused past the byte and pixel bounds."""
        from PIL import Image, UnidentifiedImageError

        if not data:
            raise RequestError(400, "the request holds no image: send the PNG or JPEG bytes as the body")
        if len(data) > self.limits.max_image_bytes:
            raise RequestError(413, f"the image has {len(data)} bytes; the explorer takes at most "
                                    f"{self.limits.max_image_bytes}")
        try:
            image = Image.open(io.BytesIO(data))  # reads the header only
        except (UnidentifiedImageError, OSError):
            raise RequestError(400, "the body is not an image Pillow can read: send a PNG or JPEG") from None
        if image.format not in ("PNG", "JPEG"):
            raise RequestError(415, f"the image is {image.format}; the explorer takes PNG or JPEG")
        width, height = image.size
        if width * height > self.limits.max_image_pixels:
            raise RequestError(413, f"the image is {width} x {height} pixels; the explorer takes at most "
                                    f"{self.limits.max_image_pixels} pixels (resize it first)")
        try:
            return image.convert("RGB")
        except (OSError, ValueError) as error:
            raise RequestError(400, f"the image could not be decoded: {error}") from None

    def view(self, data: bytes, off: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """Per-head class-token maps ``[L, H, gh, gw]``, the rollout ``[gh, gw]``, the image as the
        model saw it (PNG) and, for a classifier, its label probabilities."""
        from ..hf.vision import image_attention

        image = self.read(data)
        pixels = self.steps(image).to(next(self.inner.parameters()).dtype)  # [1, 3, height, width]
        chosen: dict[str, list[int]] = {}
        for layer, head in off:
            chosen.setdefault(self.layers[layer - 1], []).append(head - 1)
        masked = mask_heads(self.model, chosen) if chosen else contextlib.nullcontext()
        with torch.no_grad(), masked:
            seen = image_attention(self.inner, pixels)
            logits = self.inner(pixel_values=pixels).logits[0].float() if self.classifier else None
        if seen.prefix < 1:
            raise RequestError(422, f"{self.name} puts no class token before its patches; the explorer draws the "
                                    f"class token's attention only")
        class_maps = seen.class_token_maps()  # {layer: [H, gh, gw]}
        H = max(self.heads)
        stacked = torch.zeros(len(class_maps), H, *seen.grid)  # [L, H, gh, gw]
        for index, maps in enumerate(class_maps.values()):
            stacked[index, : maps.shape[0]] = maps
        rollout = attention_rollout([weights[None] for weights in seen.attentions.values()], head_fusion="max",
                                    discard_ratio=0.9)[-1, 0]  # [N, N]
        rollout_map = rollout[0, seen.prefix:].reshape(seen.grid)
        prefix_mass = [[1.0 - float(row) for row in weights[:, 0, seen.prefix:].sum(-1)]
                       for weights in seen.attentions.values()]  # [L][H]: the class token's mass before the patches
        prediction = None
        if logits is not None:
            probabilities = torch.softmax(logits, -1)
            top = torch.topk(probabilities, min(10, probabilities.shape[-1]))
            prediction = {"kind": "label", "top": [{"id": int(i), "token": self.label_names[int(i)],
                                                    "probability": float(p)} for p, i in zip(*top)]}
        return {"grid": list(seen.grid), "prefix": seen.prefix, "patch_size": seen.patch_size,
                "maps": pack_weights(stacked / stacked.amax((-2, -1), keepdim=True).clamp_min(1e-12)),
                "shape": list(stacked.shape), "rollout": pack_weights(rollout_map / rollout_map.max().clamp_min(1e-12)),
                "image": _png(self.steps.displayable(pixels)), "prediction": prediction,
                "off": [f"{l}:{h}" for l, h in off], "statistics": {"class token's mass on the prefix": prefix_mass},
                "rollout_settings": "head fusion max, discard ratio 0.9 (vit-explain's)"}


def _png(array: np.ndarray) -> str:
    """``[height, width, 3]`` in ``[0, 1]`` as a base64 PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray((array * 255).round().astype(np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")
