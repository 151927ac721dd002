"""One image through a vision transformer: the class token's attention over the patches and the
rollout, laid over the image, and a page (what ``attnlab inspect --image`` does).

Dimension letters: ``L`` layers, ``H`` heads, ``N`` tokens, ``gh x gw`` the patch grid.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from ..inspect.compute.artifact_tokens import ARTIFACT_CRITERION, ArtifactToken
from ..inspect.compute.rollout import attention_rollout
from ..inspect.draw.image_overlay import plot_patch_overlay
from ..inspect.draw.report import inline_frame, render_summary
from .._files import write_json

__all__ = ["ImageInspection", "write_image_inspection"]


@dataclass
class ImageInspection:
    """What :func:`write_image_inspection` wrote.

    Attributes:
        report: ``report.html``.
        figures: the PNGs.
        grid: ``(gh, gw)`` patches; ``prefix``: tokens before them.
        class_maps: ``{layer: [H, gh, gw]}`` the class token's attention over the patches.
        rollout: ``[gh, gw]`` the class token's rollout after the last layer.
        artifact_tokens: the patches named as artifact tokens (high output norm), largest first.
    """

    report: Path
    figures: list[Path] = field(default_factory=list)
    grid: tuple[int, int] = (0, 0)
    prefix: int = 0
    class_maps: dict[str, torch.Tensor] = field(default_factory=dict)
    rollout: Optional[torch.Tensor] = None
    artifact_tokens: list[ArtifactToken] = field(default_factory=list)

    def _repr_html_(self) -> str:
        return inline_frame(self.report.read_text(encoding="utf-8"), height=900)


def write_image_inspection(
    model: nn.Module,
    image: Any,
    out: Union[str, Path],
    *,
    size: Optional[tuple[int, int]] = None,
    head_fusion: str = "max",
    discard_ratio: float = 0.9,
    model_name: str = "model",
    image_name: str = "image",
    preprocessing: Optional[Any] = None,
    artifact_norm_ratio: float = 2.0,
) -> ImageInspection:
    """Write ``layer_<k>.png`` (each head's and the heads' mean class-token map over the image),
    ``rollout.png``, ``statistics.json`` and ``report.html`` into ``out``.

    Args:
        model: a transformers vision transformer (or a model with a vision tower).
        image: an RGB ``PIL.Image``.
        out: output directory (created).
        size: ``(height, width)`` the image is resized to (default the model's own size);
            other sizes than the model's go through interpolated position embeddings.
        head_fusion, discard_ratio: the rollout's (vit-explain's defaults: ``max``, 0.9).
        model_name, image_name: shown on the page.
        preprocessing: the model directory's :class:`~attnlab.data.images.ImagePreprocessing`
            (``read_image_preprocessing(directory)``); default ViT's (the model's size, mean and std 0.5).
        artifact_norm_ratio: a patch whose output norm is at least this many times the median patch's
            is named an artifact token (Darcet et al. 2023), on the page and in ``statistics.json``.
    """
    from ..hf.opening import transformers_module
    from ..hf.vision import image_attention, image_steps

    if head_fusion not in ("mean", "max", "min"):
        raise ValueError(f"head_fusion must be mean, max or min, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must lie in [0, 1), got {discard_ratio!r}")
    inner = transformers_module(model)
    steps = image_steps(inner, size=size, preprocessing=preprocessing)
    pixels = steps(image).to(next(inner.parameters()).dtype)  # [1, 3, height, width]
    seen = image_attention(inner, pixels)
    if seen.prefix < 1:
        raise ValueError(f"{model_name} puts no class token before its patches (SigLIP pools without one); "
                         f"attnlab draws the class token's attention only")
    shown = steps.displayable(pixels)  # [height, width, 3] in [0, 1]
    class_maps = seen.class_token_maps()
    names = list(class_maps)
    stacked = [weights[None] for weights in seen.attentions.values()]  # [1, H, N, N]
    rollout = attention_rollout(stacked, head_fusion=head_fusion, discard_ratio=discard_ratio)[-1, 0]  # [N, N]
    rollout_map = rollout[0, seen.prefix:].reshape(seen.grid)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures, images = [], {}
    for index, name in enumerate(names, 1):
        maps = class_maps[name]
        panels = torch.cat([maps, maps.mean(0, keepdim=True)]).numpy()
        titles = [f"head {h + 1}" for h in range(maps.shape[0])] + ["mean of heads"]
        path = plot_patch_overlay(shown, panels, out / f"layer_{index}.png", titles=titles,
                                  title=f"{name}: the class token's attention over the patches")
        figures.append(path)
        images[f"{name}: class token -> patches, per head"] = path
    path = plot_patch_overlay(shown, rollout_map[None].numpy(), out / "rollout.png",
                              titles=[f"rollout ({head_fusion}, discard {discard_ratio:g})"],
                              title="class token's rollout after the last layer")
    figures.append(path)
    images["rollout"] = path
    artifacts = _artifacts(seen, artifact_norm_ratio)
    prefix_mass = {name: (1.0 - weights[:, 0, seen.prefix:].sum(-1)).tolist()
                   for name, weights in seen.attentions.items()}
    statistics = {
        "model": model_name, "image": image_name, "grid": list(seen.grid), "patch_size": seen.patch_size,
        "prefix_tokens": seen.prefix, "queries": "class token", "keys": "patches (row-major on the grid)",
        "layers": {name: {"class_to_prefix_mass": prefix_mass[name],
                          "class_to_patches": [m.flatten().tolist() for m in class_maps[name]]} for name in names},
        "rollout": {"head_fusion": head_fusion, "discard_ratio": discard_ratio,
                    "class_to_patches": rollout_map.flatten().tolist()},
        "artifact_tokens": artifacts,
    }
    write_json(out / "statistics.json", statistics)
    page = render_summary(
        {"class token's mass on the tokens before the patches": [prefix_mass[name] for name in names]}, names,
        title="attnlab image attention",
        meta={"model": model_name, "image": image_name,
              "patch grid": f"{seen.grid[0]} x {seen.grid[1]} patches of {seen.patch_size} px, "
                            f"{seen.prefix} token(s) before them (class token first)"},
        images=images,
        extra_tables={"Artifact tokens": _artifacts_html(artifacts)},
    )
    report = out / "report.html"
    report.write_text(page, encoding="utf-8")
    found = [ArtifactToken(**token) for token in artifacts["tokens"]]
    return ImageInspection(report, figures, seen.grid, seen.prefix, class_maps, rollout_map, found)


def _artifacts(seen: Any, norm_ratio: float) -> dict[str, Any]:
    """``statistics.json``'s ``artifact_tokens``: the criterion, the median norm and the tokens named."""
    if seen.patch_norms is None:
        return {"criterion": "not measured: the model returned no hidden states", "tokens": []}
    tokens = seen.artifact_tokens(norm_ratio=norm_ratio)
    norms = seen.patch_norms
    return {"criterion": ARTIFACT_CRITERION.format(ratio=norm_ratio), "norm_ratio": norm_ratio,
            "norm": "the last block's output, before the final norm", "median_norm": float(norms.median()),
            "largest_norm_ratio": float(norms.max() / norms.median()),
            "attention": "the class token's last-layer attention over the patches, heads averaged",
            "tokens": [token.as_dict() for token in tokens]}


def _artifacts_html(artifacts: dict[str, Any]) -> str:
    """The page's section: the criterion and one row per named patch (escaped)."""
    criterion = html.escape(artifacts["criterion"])
    if "median_norm" not in artifacts:
        return f"<p>{criterion}</p>"
    lead = (f"<p>Criterion: {criterion}. Median patch norm {artifacts['median_norm']:.3g}; the largest is "
            f"{artifacts['largest_norm_ratio']:.2f} x the median.</p>")
    if not artifacts["tokens"]:
        return lead + "<p>No patch meets it: this image shows no artifact token.</p>"
    rows = "".join(
        f"<tr><td>{t['row']}</td><td>{t['column']}</td><td>{t['norm']:.4g}</td><td>{t['norm_ratio']:.2f}</td>"
        f"<td>{'' if t['attention'] is None else format(t['attention'], '.4f')}</td>"
        f"<td>{'' if t['attention_ratio'] is None else format(t['attention_ratio'], '.2f')}</td></tr>"
        for t in artifacts["tokens"])
    return (lead + '<table class="artifacts"><thead><tr><th>row</th><th>column</th><th>norm</th>'
            "<th>norm / median</th><th>class token's attention</th><th>attention x patches</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")
