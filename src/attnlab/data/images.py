"""Images: a PNG or JPEG file read (:func:`load_image`), and an image model's own preprocessing,
read from its ``preprocessor_config.json``.

A vision checkpoint ships the steps its image processor takes before the model sees the
pixels: resize (to ``size = {"height", "width"}``, or the shortest edge to
``size = {"shortest_edge"}`` keeping the aspect ratio), centre crop (``crop_size``), rescale
(``rescale_factor``, 1/255) and normalise (``image_mean``, ``image_std``), each switched by its
``do_*`` key, with Pillow's ``resample`` filter. :class:`ImagePreprocessing` reads those keys
and applies them with Pillow and numpy in the order transformers' image processors do
(ViT's, DeiT's, CLIP's, BiT's for DINOv2), so the pixels equal ``AutoImageProcessor``'s
without importing transformers. A config with none (a model saved without its processor)
gives ``None``, and callers fall back to ViT's defaults (the model's ``image_size``,
mean and std 0.5). Nothing here imports transformers, and Pillow is imported only when an
image is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import Tensor

__all__ = ["ImagePreprocessing", "load_image", "read_image_preprocessing"]

FILE_NAME = "preprocessor_config.json"


def load_image(path: Union[str, Path], *, argument: str = "--image"):
    """An RGB ``PIL.Image`` from a PNG or JPEG file (Pillow ships with matplotlib).

    Raises:
        FileNotFoundError: no such file. ValueError: a folder, or Pillow cannot read it.
    """
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{argument} {str(path)!r} is a folder; give one PNG or JPEG file")
    if not path.is_file():
        raise FileNotFoundError(f"{argument} {str(path)!r}: no such file")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{argument} {str(path)!r} is not an image Pillow can read (PNG or JPEG): {error}") from None


@dataclass(frozen=True)
class ImagePreprocessing:
    """The steps from an RGB image to a model's ``pixel_values``.

    Attributes:
        size: ``(height, width)`` the image is resized to, or ``None``.
        shortest_edge: resize so that the shorter side has this length (``size`` is then ``None``).
        crop: ``(height, width)`` of the centre crop after resizing, or ``None``.
        resample: Pillow's filter number (2 bilinear, 3 bicubic).
        rescale_factor: multiplies the 0-255 values (``None``: not rescaled).
        mean, std: per channel, subtracted and divided after rescaling (``None``: not normalised).
    """

    size: Optional[tuple[int, int]] = None
    shortest_edge: Optional[int] = None
    crop: Optional[tuple[int, int]] = None
    resample: int = 2
    rescale_factor: Optional[float] = 1 / 255
    mean: Optional[tuple[float, float, float]] = (0.5, 0.5, 0.5)
    std: Optional[tuple[float, float, float]] = (0.5, 0.5, 0.5)

    @classmethod
    def from_dict(cls, settings: dict[str, Any], *, where: str = FILE_NAME) -> "ImagePreprocessing":
        """The steps a ``preprocessor_config.json``'s keys describe.

        Raises:
            ValueError: a resize or crop size attnlab does not know, named with its file.
        """
        size = shortest = crop = None
        if settings.get("do_resize", True) and settings.get("size") is not None:
            size, shortest = _size(settings["size"], "size", where)
        if settings.get("do_center_crop", False) and settings.get("crop_size") is not None:
            crop, edge = _size(settings["crop_size"], "crop_size", where)
            crop = crop or (edge, edge)
        rescale = float(settings.get("rescale_factor", 1 / 255)) if settings.get("do_rescale", True) else None
        mean = std = None
        if settings.get("do_normalize", True):
            mean = _triple(settings.get("image_mean", 0.5))
            std = _triple(settings.get("image_std", 0.5))
        return cls(size, shortest, crop, int(settings.get("resample", 2)), rescale, mean, std)

    def with_size(self, size: tuple[int, int]) -> "ImagePreprocessing":
        """The same steps, resized to ``(height, width)`` exactly and not cropped."""
        return ImagePreprocessing(tuple(size), None, None, self.resample, self.rescale_factor, self.mean, self.std)

    def resized(self, image: Any) -> np.ndarray:
        """``[height, width, 3]`` uint8: the image resized and cropped, before rescaling."""
        image = image.convert("RGB")
        if self.size is not None or self.shortest_edge is not None:
            height, width = self.size or _shortest_edge_size(image.height, image.width, self.shortest_edge)
            image = image.resize((width, height), resample=self.resample)
        array = np.asarray(image, dtype=np.uint8)
        return array if self.crop is None else _centre_crop(array, self.crop)

    def __call__(self, image: Any) -> Tensor:
        """``[1, 3, height, width]`` float32 pixel values of an RGB ``PIL.Image``."""
        array = self.resized(image).astype(np.float32)  # [height, width, 3]
        if self.rescale_factor is not None:
            array = array * np.float32(self.rescale_factor)
        if self.mean is not None:
            array = (array - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)[None]  # [1, 3, height, width]

    def displayable(self, pixels: Tensor) -> np.ndarray:
        """``[height, width, 3]`` in ``[0, 1]``: ``pixels`` (``[1, 3, height, width]``) un-normalised."""
        array = pixels[0].float().permute(1, 2, 0).numpy()  # [height, width, 3]
        if self.mean is not None:
            array = array * np.asarray(self.std, dtype=np.float32) + np.asarray(self.mean, dtype=np.float32)
        if self.rescale_factor is not None:
            array = array / (255.0 * self.rescale_factor)
        else:
            array = array / 255.0
        return np.clip(array, 0.0, 1.0)


def read_image_preprocessing(directory: Union[str, Path]) -> Optional[ImagePreprocessing]:
    """The steps ``directory/preprocessor_config.json`` describes, or ``None`` without that file.

    Raises:
        ValueError: the file is not JSON, or names a size attnlab does not know.
    """
    path = Path(directory) / FILE_NAME
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: expected a JSON object of image processor settings")
    return ImagePreprocessing.from_dict(settings, where=str(path))


def _size(value: Any, key: str, where: str) -> tuple[Optional[tuple[int, int]], Optional[int]]:
    """``((height, width), None)`` or ``(None, shortest_edge)``."""
    if isinstance(value, int):
        return (value, value), None
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return (int(value["height"]), int(value["width"])), None
        if set(value) == {"shortest_edge"}:
            return None, int(value["shortest_edge"])
    raise ValueError(f"{where}: {key} {value!r} is not one attnlab applies; expected {{'height', 'width'}} "
                     f"or {{'shortest_edge'}}")


def _triple(value: Any) -> tuple[float, float, float]:
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"image_mean and image_std need one value per RGB channel, got {value!r}")
    return tuple(values)


def _shortest_edge_size(height: int, width: int, edge: int) -> tuple[int, int]:
    """transformers' ``get_resize_output_image_size`` with ``default_to_square=False``."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def _centre_crop(array: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """transformers' ``center_crop``: zero padding first where the crop is larger than the image."""
    height, width = array.shape[:2]
    crop_height, crop_width = crop
    if crop_height > height or crop_width > width:
        padded = np.zeros((max(height, crop_height), max(width, crop_width), 3), dtype=array.dtype)
        top, left = -(-(padded.shape[0] - height) // 2), -(-(padded.shape[1] - width) // 2)  # rounded up
        padded[top:top + height, left:left + width] = array
        array, (height, width) = padded, padded.shape[:2]
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    return array[top:top + crop_height, left:left + crop_width]
