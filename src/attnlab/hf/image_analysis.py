"""Attention statistics of a vision transformer over a folder of images.

Dimension letters: ``H`` heads, ``N`` tokens (prefix + patches), ``P`` prefix tokens,
``G`` patches (``gh * gw``).

Every image goes through the model's preprocessing and :func:`~attnlab.hf.vision.image_attention`;
each layer's ``[H, N, N]`` maps feed attnlab's per-head statistics (entropy, sparsity, top-k
mass, Gini; the one-dimensional ones, offsets and the neighbour band, mean nothing on a grid
and are left out) and three that belong to images, averaged over images:

* ``mean_attention_distance``: ``sum_s p_s |pos(t) - pos(s)|`` in pixels over the patch
  queries' rows renormalised over the patches, the distance of Dosovitskiy et al.'s figure 7
  (ViT), the 2-D counterpart of ``mean_distance``;
* ``class_prefix_mass``: the class token's mass on the tokens before the patches (itself,
  distillation and register tokens);
* ``class_patch_entropy``: entropy (nats) of the class token's attention over the patches,
  renormalised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from torch import Tensor, nn

from ..inspect.compute.analyzer import AttentionStatistics
from ..inspect.compute.statistics import HeadStatistics
from ..data.images import ImagePreprocessing
from .opening import transformers_module
from .vision import image_attention

__all__ = ["IMAGE_SUFFIXES", "analyze_images", "image_files"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
_ONE_DIMENSIONAL = ("mean_offset", "mean_distance", "alignment_score", "alignment_argmax")


def image_files(folder: Any, *, limit: Optional[int] = None, argument: str = "--images") -> list[Path]:
    """The PNG and JPEG files directly in ``folder``, sorted by name (the first ``limit``).

    Raises:
        FileNotFoundError: no such folder. ValueError: no image in it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{argument} {str(folder)!r}: no such folder")
    files = sorted(path for path in folder.iterdir() if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"{argument} {str(folder)!r} holds no PNG or JPEG file")
    return files[:limit] if limit is not None else files


def _patch_positions(grid: tuple[int, int], patch: int) -> Tensor:
    """``[G, 2]`` patch centres in pixels, row-major."""
    gh, gw = grid
    rows, columns = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    return torch.stack([rows.flatten(), columns.flatten()], -1).double() * patch


def analyze_images(
    model: nn.Module,
    images: Iterable[Any],
    preprocessing: ImagePreprocessing,
    *,
    sparsity_threshold: float = 0.1,
    top_k: int = 3,
) -> AttentionStatistics:
    """Per-layer, per-head statistics of a vision transformer over ``images``.

    Args:
        model: a transformers vision transformer (or a ``TransformersModel`` wrapping one).
        images: RGB ``PIL.Image`` objects.
        preprocessing: how each image becomes pixels (:func:`~attnlab.hf.vision.image_steps`).
        sparsity_threshold, top_k: as :class:`~attnlab.inspect.HeadStatistics`.

    Returns:
        :class:`~attnlab.inspect.AttentionStatistics`; ``examples`` counts images, ``tokens``
        the tokens they made.
    """
    inner = transformers_module(model)
    dtype = next(inner.parameters()).dtype
    heads = HeadStatistics(sparsity_threshold=sparsity_threshold, top_k=top_k)
    sums: dict[str, dict[str, Tensor]] = {}
    examples = tokens = 0
    prefixes, grids = set(), set()
    for image in images:
        seen = image_attention(inner, preprocessing(image).to(dtype))
        P, grid = seen.prefix, seen.grid
        positions = _patch_positions(grid, seen.patch_size)  # [G, 2]
        distance = torch.cdist(positions, positions)  # [G, G] pixels
        for layer, weights in seen.attentions.items():  # [H, N, N]
            N = weights.shape[-1]
            mask = torch.ones(1, N, dtype=torch.bool)
            heads.update(layer, weights[None], mask, mask)
            patch_rows = weights[:, P:, P:].double()  # [H, G, G]
            patch_rows = patch_rows / patch_rows.sum(-1, keepdim=True).clamp_min(1e-30)
            found = {"mean_attention_distance": (patch_rows * distance).sum(-1).mean(-1)}  # [H]
            if P > 0:
                row = weights[:, 0].double()  # [H, N]
                over_patches = row[:, P:] / row[:, P:].sum(-1, keepdim=True).clamp_min(1e-30)  # [H, G]
                found["class_prefix_mass"] = row[:, :P].sum(-1)
                found["class_patch_entropy"] = -(over_patches * over_patches.clamp_min(1e-30).log()).sum(-1)
            kept = sums.setdefault(layer, {})
            for name, value in found.items():
                kept[name] = kept.get(name, 0) + value
        examples += 1
        tokens += N
        prefixes.add(P)
        grids.add(grid)
    if examples == 0:
        raise ValueError("no image to analyse")
    means = heads.means()
    layers = list(means)
    found = dict.fromkeys(name for layer in layers for name in means[layer])
    names = [name for name in found if name not in _ONE_DIMENSIONAL]
    table = {name: {layer: means[layer].get(name) for layer in layers} for name in names}
    for name in dict.fromkeys(n for layer in layers for n in sums[layer]):
        table[name] = {layer: (sums[layer][name] / examples).tolist() for layer in layers}
    return AttentionStatistics(
        layers=layers,
        num_heads=[len(means[layer]["entropy"]) for layer in layers],
        statistics=table,
        rows=heads.row_counts(),
        rollout=None,
        examples=examples,
        tokens=tokens,
        settings={
            "sparsity_threshold": sparsity_threshold, "top_k": top_k, "prefix_tokens": sorted(prefixes),
            "path": "transformers, every layer's weights from attnlab's attention function, one image at a time",
            "patch_grids": [list(grid) for grid in sorted(grids)],
        },
    )
