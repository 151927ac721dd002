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

The same pass keeps each patch's output norm (the last block's output, before the model's
final norm: a LayerNorm divides every token by its own spread and would hide a token that is
large in every channel), which :meth:`ImageAttention.artifact_tokens` compares with the median
patch to name Darcet et al.'s high-norm artifact tokens. :func:`attention_share` measures how
much of the class token's attention (per head, the heads' mean, and the rollout) falls on a
region given as a pixel mask, against the region's share of the area.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .._moved import moved_names
from ..data.images import ImagePreprocessing, read_image_preprocessing
from ..inspect.compute.artifact_tokens import ArtifactToken, find_artifact_tokens
from ..inspect.compute.patch_regions import ObjectShare, patch_coverage, region_share
from ..inspect.compute.rollout import attention_rollout
from .backend import attach

__all__ = ["ImageAttention", "attention_share", "image_attention", "image_steps", "pixels_for",
           "read_image_preprocessing", "vision_config"]


@dataclass
class ImageAttention:
    """One image's self-attention in a vision transformer.

    Attributes:
        attentions: ``{"layer_k": [H, N, N]}`` (``vision.layer_k`` in a two-tower model).
        grid: ``(gh, gw)`` patches.
        prefix: ``P``, tokens before the patches (the class token is token 0 when ``P > 0``).
        patch_size: side of a patch in pixels.
        patch_norms: ``[gh, gw]`` each patch's output norm (the last block's output), or ``None``
            where the model returned no hidden states.
    """

    attentions: dict[str, Tensor]
    grid: tuple[int, int]
    prefix: int
    patch_size: int
    patch_norms: Optional[Tensor] = None

    def class_token_maps(self) -> dict[str, Tensor]:
        """``{layer: [H, gh, gw]}``: what the class token (token 0) gives each patch."""
        if self.prefix < 1:
            raise ValueError("this model has no class token (no token before the patches); use the rollout "
                             "or a patch's own row")
        gh, gw = self.grid
        return {name: weights[:, 0, self.prefix:].reshape(-1, gh, gw) for name, weights in self.attentions.items()}

    def artifact_tokens(self, *, norm_ratio: float = 2.0) -> list[ArtifactToken]:
        """The patches whose output norm is at least ``norm_ratio`` times the median patch's, with the
        class token's last-layer attention (heads averaged) on each
        (:func:`~attnlab.inspect.compute.artifact_tokens.find_artifact_tokens`)."""
        if self.patch_norms is None:
            raise ValueError("this model returned no hidden states, so there are no patch norms to compare")
        attention = None
        if self.prefix > 0:
            attention = list(self.class_token_maps().values())[-1].mean(0)  # [gh, gw]
        return find_artifact_tokens(self.patch_norms, attention, norm_ratio=norm_ratio)


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
        outputs = part(pixel_values=pixel_values, output_hidden_states=True, **extra)
        weights = {name: value[0].detach().float() for name, value in seen.attentions.items()
                   if not name.startswith("text.")}
    hidden = getattr(outputs, "hidden_states", None)
    if not weights:
        raise ValueError(f"{type(model).__name__}: no attention was recorded for the image")
    gh, gw = pixel_values.shape[2] // patch, pixel_values.shape[3] // patch
    N = next(iter(weights.values())).shape[-1]
    prefix = N - gh * gw
    if prefix < 0:
        raise ValueError(f"the model saw {N} tokens, fewer than the {gh} x {gw} patches of the image; "
                         f"attnlab cannot place them on a grid")
    norms = None
    if hidden:
        norms = hidden[-1][0, prefix:].float().norm(dim=-1).reshape(gh, gw)  # [gh, gw]
    return ImageAttention(weights, (gh, gw), prefix, patch, norms)


def attention_share(seen: ImageAttention, mask, *, layer: Optional[str] = None, head_fusion: str = "mean",
                    discard_ratio: float = 0.0) -> ObjectShare:
    """How much of the class token's attention falls on the region ``mask`` covers.

    Args:
        seen: :func:`image_attention`'s result.
        mask: ``[height, width]`` bool pixel mask of the image as the model saw it, ``True`` on the region.
        layer: whose attention (default the last layer's).
        head_fusion, discard_ratio: the rollout's (:func:`~attnlab.inspect.compute.rollout.attention_rollout`;
            default the paper's mean of heads, nothing discarded).

    Returns:
        :class:`~attnlab.inspect.compute.patch_regions.ObjectShare`: each head's share, the share of
        the heads' mean map and of the class token's rollout row, and the region's share of the area
        (what even attention would give).
    """
    maps = seen.class_token_maps()
    name = layer or list(maps)[-1]
    if name not in maps:
        raise ValueError(f"layer {name!r} is not one of the model's: {', '.join(maps)}")
    coverage = patch_coverage(mask, seen.grid, seen.patch_size)  # [gh, gw]
    per_head = region_share(maps[name], coverage)  # [H]
    fused = float(region_share(maps[name].mean(0), coverage))
    stacked = [weights[None] for weights in seen.attentions.values()]  # [1, H, N, N]
    rollout = attention_rollout(stacked, head_fusion=head_fusion, discard_ratio=discard_ratio)[-1, 0]  # [N, N]
    rolled = float(region_share(rollout[0, seen.prefix:], coverage))
    return ObjectShare(per_head.float(), fused, float(coverage.mean()), rolled,
                       {"layer": name, "rollout_head_fusion": head_fusion, "rollout_discard_ratio": discard_ratio})


__getattr__ = moved_names(__name__)  # load_image: attnlab.data.images
