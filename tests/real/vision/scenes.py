"""Pictures with a known object: scikit-image's horse silhouette laid on one of its textures.

The horse (``horse.png``, a dark silhouette on white) is scaled to ``size`` pixels on its longer
side and painted dark onto a 224 x 224 grey texture at ``(top, left)``; the mask says which
pixels are the horse. ``python measure_object_attention.py`` prints the attention measurements.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIDE = 224
TEXTURES = ("grass", "gravel", "brick")
# where the horse's box goes: (top, left) in pixels of the 224 x 224 canvas; and its longer side in pixels
POSITIONS = {"upper left": (14, 14), "lower right": None}  # None: flush with the lower right, 14 px in
SIZES = {"small": 84, "large": 154}


@dataclass
class Scene:
    name: str
    image: "object"  # PIL.Image, RGB, 224 x 224
    mask: np.ndarray  # [224, 224] bool, True on the horse


def skimage_folder() -> Path:
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-image is not installed; its data folder holds the pictures")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def horse_scene(texture: str, position: str, size: str, folder: Path | None = None) -> Scene:
    """The horse on ``texture`` at ``position`` (:data:`POSITIONS`) and ``size`` (:data:`SIZES`)."""
    from PIL import Image

    folder = folder or skimage_folder()
    with Image.open(folder / "horse.png") as horse:
        silhouette = np.asarray(horse.convert("L")) < 128  # [h, w] True on the horse
    with Image.open(folder / f"{texture}.png") as picture:
        background = np.asarray(picture.convert("L").resize((SIDE, SIDE), Image.BICUBIC), dtype=np.float32)
    side = SIZES[size]
    height, width = silhouette.shape
    scale = side / max(height, width)
    shape = (max(1, round(width * scale)), max(1, round(height * scale)))
    small = np.asarray(Image.fromarray(silhouette.astype(np.uint8) * 255).resize(shape, Image.BILINEAR)) >= 128
    top_left = POSITIONS[position] or (SIDE - 14 - small.shape[0], SIDE - 14 - small.shape[1])
    mask = np.zeros((SIDE, SIDE), dtype=bool)
    top, left = top_left
    mask[top:top + small.shape[0], left:left + small.shape[1]] = small
    canvas = np.where(mask, 20.0, background)  # a dark horse on the grey texture
    rgb = np.repeat(canvas[..., None], 3, axis=-1).clip(0, 255).astype(np.uint8)
    return Scene(f"horse on {texture}, {position}, {size}", Image.fromarray(rgb), mask)
