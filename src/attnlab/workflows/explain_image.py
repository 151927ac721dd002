"""``attnlab explain --image``: which patches made a vision transformer's classifier choose its
class, laid over the image (grad-attention, rollout, the last layer's raw attention).

Dimension letters: ``gh x gw`` the patch grid.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
from torch import nn

from .._files import write_json
from ..inspect.draw.image_overlay import plot_patch_overlay
from ..inspect.draw.report import render_summary

__all__ = ["ImageExplanationFiles", "write_image_explanation"]


@dataclass
class ImageExplanationFiles:
    """What :func:`write_image_explanation` wrote, and the explanation itself."""

    report: Path
    figures: list[Path] = field(default_factory=list)
    explanation: Any = None


def write_image_explanation(
    model: nn.Module,
    image: Any,
    out: Union[str, Path],
    *,
    methods: Sequence[str] = ("grad-attention", "rollout", "raw"),
    target: Optional[Union[int, str]] = None,
    preprocessing: Optional[Any] = None,
    model_name: str = "model",
    image_name: str = "image",
) -> ImageExplanationFiles:
    """Write ``explanation.png`` (one panel per method over the image), ``explanation.json``
    and ``report.html`` into ``out``.

    Args:
        model: a transformers image classifier (or a ``TransformersModel`` wrapping one).
        image: an RGB ``PIL.Image``.
        out: output directory (created).
        methods: among ``grad-attention``, ``rollout``, ``raw``.
        target: class index or label name; default the prediction.
        preprocessing: the model directory's
            :class:`~attnlab.data.images.ImagePreprocessing`; default ViT's.
        model_name, image_name: shown on the page.
    """
    from ..hf.image_explanation import explain_image
    from ..hf.opening import transformers_module
    from ..hf.vision import image_steps

    inner = transformers_module(model)
    steps = image_steps(inner, preprocessing=preprocessing)
    pixels = steps(image).to(next(inner.parameters()).dtype)  # [1, 3, height, width]
    explanation = explain_image(inner, pixels, tuple(methods), target=target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = list(explanation.maps)
    panels = [explanation.maps[name].numpy() for name in names]
    figure = plot_patch_overlay(steps.displayable(pixels), np.stack(panels), out / "explanation.png",
                                titles=names, title=f"why {explanation.label!r} "
                                                    f"(p = {explanation.probability:.3f}): patches by method")
    gh, gw = explanation.grid
    write_json(out / "explanation.json", {
        "model": model_name, "image": image_name, "target": explanation.target, "label": explanation.label,
        "probability": explanation.probability, "grid": [gh, gw], "prefix_tokens": explanation.prefix,
        "top_classes": [{"label": label, "probability": p} for label, p in explanation.top_classes],
        "scores": {name: explanation.maps[name].flatten().tolist() for name in names},
        "scores_layout": "one score per patch, row-major on the grid",
    })
    rows = "".join(f"<tr><td>{html.escape(label)}</td><td>{p:.4f}</td></tr>" for label, p in explanation.top_classes)
    page = render_summary(
        {}, [], title="attnlab image explanation",
        meta={"model": model_name, "image": image_name,
              "explained class": f"{explanation.label} (index {explanation.target}, p = {explanation.probability:.4f})",
              "patch grid": f"{gh} x {gw} patches, {explanation.prefix} token(s) before them"},
        images={f"{', '.join(names)}: the class token's view of the patches": figure},
        extra_tables={"Most probable classes": '<table class="stats"><thead><tr><th>class</th>'
                                               f"<th>probability</th></tr></thead><tbody>{rows}</tbody></table>"},
    )
    report = out / "report.html"
    report.write_text(page, encoding="utf-8")
    return ImageExplanationFiles(report, [figure], explanation)
