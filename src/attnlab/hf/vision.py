"""Vision transformers (ViT, DeiT, DINOv2, CLIP's and SigLIP's vision towers): attention over patches.

Dimension letters: ``L`` layers, ``H`` heads, ``N`` tokens (prefix + patches), ``P``
prefix tokens (class, distillation, register tokens), ``gh x gw`` the patch grid.

:func:`image_attention` runs one image through the model under :func:`~attnlab.hf.attach`
and returns every layer's ``[H, N, N]`` map with the patch grid it covers. The grid comes
from the pixels' size and the patch size (``gh = height // p``, ``gw = width // p``), and
the tokens before the patches are ``P = N - gh * gw``: 1 for ViT and DINOv2 (class), 2 for
DeiT (class, distillation), ``1 + registers`` for DINOv2 with registers, 0 for SigLIP.
Images of another size than the model's go through ``interpolate_pos_encoding`` where the
model takes it (ViT, DeiT, CLIP; DINOv2 always interpolates).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .._moved import moved_names
from ..data.images import ImagePreprocessing, read_image_preprocessing
from .backend import attach

__all__ = ["ImageAttention", "image_attention", "image_steps", "pixels_for", "read_image_preprocessing", "vision_config"]


@dataclass
class ImageAttention:
    """One image's self-attention in a vision transformer.

    Attributes:
        attentions: ``{"layer_k": [H, N, N]}`` (``vision.layer_k`` in a two-tower model).
        grid: ``(gh, gw)`` patches.
        prefix: ``P``, tokens before the patches (the class token is token 0 when ``P > 0``).
        patch_size: side of a patch in pixels.
    """

    attentions: dict[str, Tensor]
    grid: tuple[int, int]
    prefix: int
    patch_size: int

    def class_token_maps(self) -> dict[str, Tensor]:
        """``{layer: [H, gh, gw]}``: what the class token (token 0) gives each patch."""
        if self.prefix < 1:
            raise ValueError("this model has no class token (no token before the patches); use the rollout "
                             "or a patch's own row")
        gh, gw = self.grid
        return {name: weights[:, 0, self.prefix:].reshape(-1, gh, gw) for name, weights in self.attentions.items()}


def vision_config(model: nn.Module) -> Any:
    """The config that holds ``patch_size`` and ``image_size`` (a two-tower model's ``vision_config``)."""
    config = model.config
    return getattr(config, "vision_config", None) or config


def pixels_for(model: nn.Module, image, *, size: Optional[tuple[int, int]] = None,
               mean: Optional[tuple] = None, std: Optional[tuple] = None,
               preprocessing: Optional[ImagePreprocessing] = None) -> Tensor:
    """``[1, 3, height, width]`` pixel values of an RGB ``PIL.Image``.

    With ``preprocessing`` (the model directory's own, :func:`read_image_preprocessing`)
    the image goes through its steps, as transformers' ``AutoImageProcessor`` would take it;
    ``size`` then replaces its resize and crop. Without, the image is resized to ``size``
    (default the model's ``image_size``) with a bicubic filter, scaled to ``[0, 1]`` and
    normalised by ``mean`` / ``std`` (default 0.5, ViT's). A ``size`` that is not a multiple
    of the patch size is cut down to one.
    """
    steps = image_steps(model, size=size, mean=mean, std=std, preprocessing=preprocessing)
    dtype = next(model.parameters()).dtype
    return steps(image).to(dtype)


def image_steps(model: nn.Module, *, size: Optional[tuple[int, int]] = None, mean: Optional[tuple] = None,
                std: Optional[tuple] = None,
                preprocessing: Optional[ImagePreprocessing] = None) -> ImagePreprocessing:
    """The :class:`ImagePreprocessing` :func:`pixels_for` applies (its arguments, same meaning)."""
    config = vision_config(model)
    if size is not None:
        patch = _patch_size(config)
        size = tuple(max(patch, (int(value) // patch) * patch) for value in size)
    if preprocessing is not None:
        return preprocessing if size is None else preprocessing.with_size(size)
    if size is None:
        side = getattr(config, "image_size", None)
        side = side if isinstance(side, (list, tuple)) else (side, side)
        patch = _patch_size(config)
        size = tuple(max(patch, (int(value) // patch) * patch) for value in side)
    return ImagePreprocessing(size=size, resample=3,  # bicubic
                              mean=tuple(mean or (0.5, 0.5, 0.5)), std=tuple(std or (0.5, 0.5, 0.5)))


def _patch_size(config: Any) -> int:
    patch = getattr(config, "patch_size", None)
    patch = patch[0] if isinstance(patch, (list, tuple)) else patch
    if not isinstance(patch, int) or patch < 1:
        raise ValueError(f"{type(config).__name__} names no patch_size; attnlab draws patch grids of "
                         f"vision transformers only")
    return patch


def _vision_part(model: nn.Module) -> nn.Module:
    """What takes ``pixel_values`` alone: the model, or its vision tower (CLIP, SigLIP)."""
    for name in ("vision_model", "vision_tower"):
        part = getattr(model, name, None)
        if isinstance(part, nn.Module):
            return part
    return model


def _position_options(model: nn.Module, part: nn.Module, pixel_values: Tensor) -> dict[str, Any]:
    """``interpolate_pos_encoding=True`` for an image of another size than the model's, where
    ``part``'s forward takes it."""
    side = getattr(vision_config(model), "image_size", None)
    native = tuple(side) if isinstance(side, (list, tuple)) else (side, side)
    if tuple(pixel_values.shape[2:]) != native and "interpolate_pos_encoding" in inspect.signature(
            part.forward).parameters:
        return {"interpolate_pos_encoding": True}
    return {}


def image_attention(model: nn.Module, pixel_values: Tensor) -> ImageAttention:
    """Every self-attention map of one image (see the module docstring).

    Args:
        model: a transformers vision transformer (``ViTModel``, ``ViTForImageClassification``,
            ``Dinov2Model``, ``CLIPModel``, ``CLIPVisionModel``, ...).
        pixel_values: ``[1, 3, height, width]``.
    """
    if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 4 or pixel_values.shape[:2] != (1, 3):
        raise ValueError(f"pixel_values must be one RGB image [1, 3, height, width], got "
                         f"{getattr(pixel_values, 'shape', pixel_values)}")
    patch = _patch_size(vision_config(model))
    part = _vision_part(model)
    extra = _position_options(model, part, pixel_values)
    with torch.no_grad(), attach(model, layers="all") as seen:
        part(pixel_values=pixel_values, **extra)
        weights = {name: value[0].detach().float() for name, value in seen.attentions.items()
                   if not name.startswith("text.")}
    if not weights:
        raise ValueError(f"{type(model).__name__}: no attention was recorded for the image")
    gh, gw = pixel_values.shape[2] // patch, pixel_values.shape[3] // patch
    N = next(iter(weights.values())).shape[-1]
    prefix = N - gh * gw
    if prefix < 0:
        raise ValueError(f"the model saw {N} tokens, fewer than the {gh} x {gw} patches of the image; "
                         f"attnlab cannot place them on a grid")
    return ImageAttention(weights, (gh, gw), prefix, patch)


__getattr__ = moved_names(__name__)  # load_image: attnlab.data.images
