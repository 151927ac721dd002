"""Which patches made a vision transformer's classifier choose its class: grad-attention,
rollout and the last layer's raw attention over the patches.

Dimension letters: ``L`` layers, ``H`` heads, ``N`` tokens (prefix + patches), ``C`` classes,
``gh x gw`` the patch grid.

``grad-attention`` is Chefer, Gur & Wolf's *Generic Attention-model Explainability* (ICCV
2021), the rule their ViT notebook applies: with ``A_l`` a layer's ``[H, N, N]`` weights and
``G_l`` the gradient of the explained class logit with respect to them, ``R = I`` and, from
layer 1 up, ``R <- R + mean_h (G_l * A_l)^+ R``; the class token's row of ``R`` over the
patches is the map (:func:`~attnlab.inspect.compute.gradient_rollout.gradient_weighted_rollout`).
The weights come from attnlab's attention function (:func:`~attnlab.hf.attach` with
``grad=True``), the pixels as :func:`~attnlab.hf.vision.image_attention` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from torch import Tensor, nn

from ..inspect.compute.attribution_target import resolve_target
from ..inspect.compute.gradient_rollout import gradient_weighted_rollout
from ..inspect.compute.rollout import attention_rollout
from .backend import attach
from .vision import _patch_size, _position_options, vision_config

__all__ = ["IMAGE_METHODS", "ImageExplanation", "explain_image"]

IMAGE_METHODS = ("grad-attention", "rollout", "raw")


@dataclass
class ImageExplanation:
    """One image's class explained over its patches.

    Attributes:
        maps: ``{method: [gh, gw]}`` non-negative scores per patch.
        target: the explained class (0-based); ``label``: its name, where the config has one.
        probability: the model's probability of that class.
        grid: ``(gh, gw)``; ``prefix``: tokens before the patches.
        top_classes: ``[(label, probability), ...]``, the five most probable.
    """

    maps: dict[str, Tensor]
    target: int
    label: str
    probability: float
    grid: tuple[int, int]
    prefix: int
    top_classes: list[tuple[str, float]] = field(default_factory=list)


def _label_names(model: nn.Module, count: int) -> list[str]:
    labels = getattr(model.config, "id2label", None) or {}
    return [str(labels.get(index, labels.get(str(index), index))) for index in range(count)]


def explain_image(
    model: nn.Module,
    pixel_values: Tensor,
    methods: tuple[str, ...] = IMAGE_METHODS,
    *,
    target: Optional[Union[int, str]] = None,
    head_fusion: str = "max",
    discard_ratio: float = 0.9,
) -> ImageExplanation:
    """Explain a transformers image classifier's class over the patches of one image.

    Args:
        model: ``ViTForImageClassification``, ``DeiTForImageClassification``,
            ``Dinov2ForImageClassification`` or another classifier whose attention goes
            through transformers' ``AttentionInterface`` and that returns ``logits``.
        pixel_values: ``[1, 3, height, width]`` (:func:`~attnlab.hf.vision.pixels_for`).
        methods: among ``grad-attention``, ``rollout`` and ``raw`` (the last layer's class
            token, heads averaged).
        target: class index or label name; default the prediction.
        head_fusion, discard_ratio: the rollout's (vit-explain's defaults).

    Returns:
        :class:`ImageExplanation`.
    """
    unknown = [name for name in methods if name not in IMAGE_METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be among {', '.join(IMAGE_METHODS)}, got {list(methods)}")
    if not isinstance(pixel_values, Tensor) or pixel_values.dim() != 4 or pixel_values.shape[:2] != (1, 3):
        raise ValueError(f"pixel_values must be one RGB image [1, 3, height, width], got "
                         f"{getattr(pixel_values, 'shape', pixel_values)}")
    patch = _patch_size(vision_config(model))
    extra = _position_options(model, model, pixel_values)
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), attach(model, layers="all", grad=True) as seen:
            output = model(pixel_values=pixel_values, **extra)
            logits = getattr(output, "logits", None)
            if not isinstance(logits, Tensor) or logits.dim() != 2:
                raise ValueError(f"{type(model).__name__} returns no [1, C] logits; explaining a class needs an image "
                                 f"classifier (ViTForImageClassification and the like)")
            names = _label_names(model, logits.shape[-1])
            classes = resolve_target(logits, target, names)  # [1]
            weights = list(seen.attentions.values())  # per layer [1, H, N, N], in the graph
            need_grad = "grad-attention" in methods
            gradients = (torch.autograd.grad(logits[0, classes[0]], weights) if need_grad else None)
    finally:
        model.train(was_training)
    weights = [w.detach().float() for w in weights]
    gh, gw = pixel_values.shape[2] // patch, pixel_values.shape[3] // patch
    N = weights[0].shape[-1]
    prefix = N - gh * gw
    if prefix < 1:
        raise ValueError(f"{type(model).__name__} puts no class token before its {gh} x {gw} patches; "
                         f"attnlab explains through the class token's row")
    maps = {}
    if need_grad:
        first = torch.zeros(1, N)
        first[0, 0] = 1.0  # the class token's row
        scores = gradient_weighted_rollout(weights, [g.detach().float() for g in gradients], first)[0]  # [N]
        maps["grad-attention"] = scores[prefix:].reshape(gh, gw)
    if "rollout" in methods:
        rolled = attention_rollout(weights, head_fusion=head_fusion, discard_ratio=discard_ratio)[-1, 0]  # [N, N]
        maps["rollout"] = rolled[0, prefix:].reshape(gh, gw)
    if "raw" in methods:
        maps["raw"] = weights[-1][0, :, 0, prefix:].mean(0).reshape(gh, gw)  # [gh, gw]
    probabilities = logits.detach().float().softmax(-1)[0]  # [C]
    chosen = int(classes[0])
    top = probabilities.topk(min(5, probabilities.numel()))
    return ImageExplanation(
        {name: maps[name] for name in methods}, chosen, names[chosen], float(probabilities[chosen]), (gh, gw),
        prefix, [(names[int(i)], float(p)) for p, i in zip(top.values, top.indices)],
    )
