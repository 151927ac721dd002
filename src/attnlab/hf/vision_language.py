"""What each word a vision-language model generates looked at in the picture.

Dimension letters: ``H`` heads, ``T`` tokens, ``N`` image tokens.

A LLaVA-style model puts its image into the language model as *image tokens*: a run of
``image_token_id`` in ``input_ids``, one per image feature, in the order the vision tower
gives them. :class:`ImageTokens` lays each such token back onto the picture (which tile, which
cell of that tile's grid), so that a row of the language model's attention over the image
tokens becomes a map over the image:

* **LLaVA** (``llava``): the picture resized (and cropped) to the tower's ``image_size``; one
  token per patch, row-major on a ``image_size / patch_size`` grid (the class token dropped,
  ``vision_feature_select_strategy="default"``; with ``"full"`` it comes first and is no cell).
* **Qwen2-VL and Qwen2.5-VL** (``qwen2_vl``, ``qwen2_5_vl``): the picture resized so that each
  side is a multiple of ``patch_size * merge_size`` and its area lies within the processor's
  bounds (``smart_resize``); each token merges ``merge_size x merge_size`` patches, row-major on a
  ``height / (patch_size * merge_size)`` by ``width / (...)`` grid, between ``<|vision_start|>``
  and ``<|vision_end|>``; ``image_grid_thw`` and ``mm_token_type_ids`` as the processor gives them.
* **Idefics 3 and SmolVLM** (``idefics3``, ``smolvlm``): the picture resized so that its longer
  side is the processor's ``size["longest_edge"]``, each side then rounded up to whole tiles of
  ``max_image_size``, and cut into ``rows x columns`` tiles, followed by the whole picture
  resized to one tile. Each tile gives ``(image_size / patch_size / scale_factor)²`` tokens,
  row-major on that grid (the pixel shuffle merges ``scale_factor²`` neighbouring patches into
  one token). The prompt is laid out as ``Idefics3Processor`` lays it: ``<fake_token_around_image>
  <row_r_col_c>`` and the tile's tokens for each tile, a newline after each row of tiles, then
  ``<fake_token_around_image><global-img>``, the whole picture's tokens and
  ``<fake_token_around_image>``; a picture that fits one tile is not cut.

:func:`vision_language_inputs` makes those inputs from an RGB image and a prompt (the model's
chat format is the user's to write in the prompt; ``<image>`` in it marks where the image goes,
else it goes first); :func:`generated_word_attention` generates greedily and gives, for each new
token, the attention of the position that predicted it over the image tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from .._files import write_json

__all__ = ["ImageTokens", "Tile", "VisionLanguageInputs", "WordAttention", "generated_word_attention",
           "is_vision_language", "vision_language_inputs"]

_TILED = ("idefics3", "smolvlm")
_SINGLE = ("llava",)
_GRID = ("qwen2_vl", "qwen2_5_vl")
FAMILIES = _SINGLE + _TILED + _GRID


@dataclass(frozen=True)
class Tile:
    """One part of the picture the model saw as an image of its own.

    Attributes:
        name: ``tile 1,2`` (row, column counted from 1) or ``whole image``.
        box: ``(top, left, bottom, right)`` on the picture, in pixels.
        grid: ``(rows, columns)`` of image tokens over the box.
    """

    name: str
    box: tuple[int, int, int, int]
    grid: tuple[int, int]


@dataclass
class ImageTokens:
    """Where each image token of ``input_ids`` lies on the picture.

    Attributes:
        positions: ``[N]`` indices in ``input_ids``, in order.
        tile: ``[N]`` index into ``tiles`` (``-1``: a class token, no cell).
        row, column: ``[N]`` the cell of the tile's grid (``-1`` for a class token).
        tiles: the tiles, in the order their tokens come.
        picture: ``[height, width, 3]`` in ``[0, 1]``: the picture the tiles cut (resized).
    """

    positions: Tensor
    tile: Tensor
    row: Tensor
    column: Tensor
    tiles: list[Tile]
    picture: np.ndarray

    def tile_map(self, weights: Tensor, index: int) -> np.ndarray:
        """``[rows, columns]`` of tile ``index``: ``weights`` (``[N]``, over the image tokens) on its grid."""
        rows, columns = self.tiles[index].grid
        grid = np.zeros((rows, columns), dtype=np.float32)
        chosen = self.tile == index
        grid[self.row[chosen].numpy(), self.column[chosen].numpy()] = weights[chosen].float().numpy()
        return grid

    def picture_maps(self, weights: Tensor) -> dict[str, np.ndarray]:
        """Maps over the whole picture, each ``[rows, columns]`` of cells of equal size: ``tiles``
        (every cut tile's grid in its place; present when the picture was cut) and ``whole image``."""
        maps: dict[str, np.ndarray] = {}
        cut = [index for index, tile in enumerate(self.tiles) if tile.name != "whole image"]
        if cut:
            rows, columns = self.tiles[cut[0]].grid
            height, width = self.picture.shape[:2]
            top, left, bottom, right = self.tiles[cut[0]].box
            tile_height, tile_width = bottom - top, right - left
            whole = np.zeros((rows * height // tile_height, columns * width // tile_width), dtype=np.float32)
            for index in cut:
                top, left = self.tiles[index].box[:2]
                r, c = top // tile_height * rows, left // tile_width * columns
                whole[r: r + rows, c: c + columns] = self.tile_map(weights, index)
            maps["tiles"] = whole
        for index, tile in enumerate(self.tiles):
            if tile.name == "whole image":
                maps["whole image"] = self.tile_map(weights, index)
        return maps


@dataclass
class VisionLanguageInputs:
    """A vision-language model's inputs for one picture and prompt, and where its image tokens lie."""

    inputs: dict[str, Tensor]
    image_tokens: ImageTokens


def is_vision_language(model: nn.Module) -> bool:
    """Whether ``model`` (a transformers model, or attnlab's wrapper of one) is of a family
    :func:`vision_language_inputs` lays out."""
    return getattr(getattr(_unwrap(model), "config", None), "model_type", None) in FAMILIES


def _unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside attnlab's wrapper (the model itself otherwise)."""
    from .opening import TransformersModel

    return model.model if isinstance(model, TransformersModel) else model


def _family_config(model: nn.Module) -> Any:
    config = _unwrap(model).config
    if config.model_type not in FAMILIES:
        raise ValueError(f"a {config.model_type} model is not a vision-language model attnlab lays images out for "
                         f"(it does: {', '.join(FAMILIES)})")
    return config


def vision_language_inputs(model: nn.Module, tokenizer: Any, image: Any, prompt: str, *,
                           preprocessing: Any = None, processor_settings: Optional[dict] = None
                           ) -> VisionLanguageInputs:
    """The inputs of ``model`` for an RGB ``PIL.Image`` and a prompt.

    Args:
        model: a LLaVA, Idefics 3, SmolVLM, Qwen2-VL or Qwen2.5-VL model (transformers'
            ``...ForConditionalGeneration``).
        tokenizer: the model's ``tokenizers.Tokenizer``.
        image: an RGB ``PIL.Image``.
        prompt: the text, in the model's chat format; ``<image>`` marks where the image goes.
        preprocessing: LLaVA's :class:`~attnlab.data.images.ImagePreprocessing`
            (``None``: resized to the tower's size, mean and std 0.5).
        processor_settings: the ``preprocessor_config.json`` of Idefics 3 (``size``,
            ``max_image_size``, ``do_image_splitting``, ``image_mean``, ``image_std``) or Qwen2-VL
            (``patch_size``, ``merge_size``, ``temporal_patch_size``, ``size`` or
            ``min_pixels`` / ``max_pixels``, ``image_mean``, ``image_std``).

    Raises:
        ValueError: a model of another family, or a tokenizer without the tokens it needs.
    """
    config = _family_config(model)
    vision = config.vision_config
    if config.model_type in _SINGLE:
        return _llava_inputs(config, vision, tokenizer, image, prompt, preprocessing)
    if config.model_type in _GRID:
        return _grid_inputs(config, vision, tokenizer, image, prompt, processor_settings or {})
    return _tiled_inputs(config, vision, tokenizer, image, prompt, processor_settings or {})


def _image_token(config: Any) -> int:
    return next(getattr(config, name) for name in ("image_token_id", "image_token_index")
                if isinstance(getattr(config, name, None), int))


def _prompt_ids(tokenizer: Any, prompt: str, block: list[int], image_token: int,
                markers: tuple[Optional[int], Optional[int]] = (None, None)) -> tuple[list[int], int]:
    """The prompt's ids with ``block`` where ``<image>`` stood, else after the leading special
    tokens (between ``markers``, Qwen2-VL's ``<|vision_start|>`` and ``<|vision_end|>``, where the
    tokenizer has both), and where the block starts."""
    encoding = tokenizer.encode(prompt)
    ids = encoding.ids
    marks = [index for index, token in enumerate(ids) if token == image_token]
    if len(marks) > 1:
        raise ValueError(f"the prompt marks {len(marks)} images (<image>); attnlab lays out one image per prompt")
    if marks:
        start = marks[0]
        return ids[:start] + block + ids[start + 1:], start
    start = next((index for index, special in enumerate(encoding.special_tokens_mask) if not special), len(ids))
    if None not in markers:
        return ids[:start] + [markers[0]] + block + [markers[1]] + ids[start:], start + 1
    return ids[:start] + block + ids[start:], start


def _llava_inputs(config: Any, vision: Any, tokenizer: Any, image: Any, prompt: str,
                  preprocessing: Any) -> VisionLanguageInputs:
    from ..data.images import ImagePreprocessing

    size, patch = vision.image_size, vision.patch_size
    steps = preprocessing or ImagePreprocessing(size=(size, size))
    pixels = steps(image)
    if tuple(pixels.shape[-2:]) != (size, size):
        raise ValueError(f"the preprocessing gives {tuple(pixels.shape[-2:])} pixels but the vision tower takes "
                         f"{size}x{size}")
    side = size // patch
    full = getattr(config, "vision_feature_select_strategy", "default") == "full"
    count = side * side + int(full)
    image_token = _image_token(config)
    ids, start = _prompt_ids(tokenizer, prompt, [image_token] * count, image_token)
    cells = torch.arange(side * side)
    tile = torch.cat([torch.full((int(full),), -1), torch.zeros(side * side, dtype=torch.long)])
    row = torch.cat([torch.full((int(full),), -1), cells // side])
    column = torch.cat([torch.full((int(full),), -1), cells % side])
    tokens = ImageTokens(torch.arange(start, start + count), tile, row, column,
                         [Tile("whole image", (0, 0, size, size), (side, side))], steps.displayable(pixels))
    ids_tensor = torch.tensor([ids])
    inputs = {"input_ids": ids_tensor, "attention_mask": torch.ones_like(ids_tensor), "pixel_values": pixels}
    return VisionLanguageInputs(inputs, tokens)


_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _smart_size(height: int, width: int, factor: int, least: int, most: int) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize``: each side a multiple of ``factor``, the area within
    ``[least, most]`` pixels, the aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the picture's aspect ratio {max(height, width) / min(height, width):.0f} is past 200, "
                         f"which Qwen2-VL's processor refuses")
    tall, wide = round(height / factor) * factor, round(width / factor) * factor
    if tall * wide > most:
        beta = math.sqrt(height * width / most)
        tall = max(factor, math.floor(height / beta / factor) * factor)
        wide = max(factor, math.floor(width / beta / factor) * factor)
    elif tall * wide < least:
        beta = math.sqrt(least / (height * width))
        tall, wide = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return tall, wide


def _grid_inputs(config: Any, vision: Any, tokenizer: Any, image: Any, prompt: str,
                 settings: dict) -> VisionLanguageInputs:
    patch = int(settings.get("patch_size", vision.patch_size))
    merge = int(settings.get("merge_size", vision.spatial_merge_size))
    temporal = int(settings.get("temporal_patch_size", vision.temporal_patch_size))
    size = settings.get("size") or {}
    least = int(settings.get("min_pixels", size.get("shortest_edge", 56 * 56)))
    most = int(settings.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280)))
    mean = np.asarray(settings.get("image_mean", _CLIP_MEAN), dtype=np.float32)
    std = np.asarray(settings.get("image_std", _CLIP_STD), dtype=np.float32)
    rgb = image.convert("RGB")
    height, width = _smart_size(rgb.height, rgb.width, patch * merge, least, most)
    resized = np.asarray(rgb.resize((width, height), resample=int(settings.get("resample", 3))), dtype=np.float32)
    normalised = ((resized * np.float32(settings.get("rescale_factor", 1 / 255)) - mean) / std).transpose(2, 0, 1)
    rows, columns = height // patch, width // patch
    patches = normalised.reshape(3, rows // merge, merge, patch, columns // merge, merge, patch)
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # merged windows row-major, then the patches inside each
    patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], temporal, patch, patch))
    pixels = torch.from_numpy(np.ascontiguousarray(patches).reshape(rows * columns, 3 * temporal * patch * patch))
    side_rows, side_columns = rows // merge, columns // merge
    count = side_rows * side_columns
    image_token = _image_token(config)
    markers = tokenizer.token_to_id("<|vision_start|>"), tokenizer.token_to_id("<|vision_end|>")
    ids, start = _prompt_ids(tokenizer, prompt, [image_token] * count, image_token, markers)
    cells = torch.arange(count)
    tokens = ImageTokens(torch.arange(start, start + count), torch.zeros(count, dtype=torch.long),
                         cells // side_columns, cells % side_columns,
                         [Tile("whole image", (0, 0, height, width), (side_rows, side_columns))], resized / 255.0)
    ids_tensor = torch.tensor([ids])
    inputs = {"input_ids": ids_tensor, "attention_mask": torch.ones_like(ids_tensor), "pixel_values": pixels,
              "image_grid_thw": torch.tensor([[1, rows, columns]]),
              "mm_token_type_ids": (ids_tensor == image_token).long()}
    return VisionLanguageInputs(inputs, tokens)


def _edge(settings: dict, key: str, default: int) -> int:
    value = settings.get(key)
    if isinstance(value, dict):
        value = value.get("longest_edge")
    return int(value) if isinstance(value, (int, float)) else default


def _tiled_inputs(config: Any, vision: Any, tokenizer: Any, image: Any, prompt: str,
                  settings: dict) -> VisionLanguageInputs:
    tile_size = _edge(settings, "max_image_size", vision.image_size)
    if tile_size != vision.image_size:
        raise ValueError(f"max_image_size {tile_size} differs from the vision tower's image_size {vision.image_size}")
    longest = _edge(settings, "size", 4 * tile_size)
    side = vision.image_size // vision.patch_size // config.scale_factor
    per_tile = side * side
    mean = np.asarray(settings.get("image_mean", [0.5] * 3), dtype=np.float32)
    std = np.asarray(settings.get("image_std", [0.5] * 3), dtype=np.float32)
    resample = int(settings.get("resample", 1))  # Lanczos, as Idefics3ImageProcessor
    rgb = image.convert("RGB")
    (height, width), (tiled_height, tiled_width) = _tile_sizes(rgb.height, rgb.width, longest, tile_size)
    resized = rgb.resize((width, height), resample=resample).resize((tiled_width, tiled_height), resample=resample)
    rows, columns = tiled_height // tile_size, tiled_width // tile_size
    split = settings.get("do_image_splitting", True) and (rows > 1 or columns > 1)
    if not split:
        rows = columns = 1
        resized = resized.resize((tile_size, tile_size), resample=resample)
    picture = np.asarray(resized, dtype=np.float32)
    whole = np.asarray(resized.resize((tile_size, tile_size), resample=resample), dtype=np.float32)
    parts = [picture[r * tile_size:(r + 1) * tile_size, c * tile_size:(c + 1) * tile_size]
             for r in range(rows) for c in range(columns)] if split else []
    parts.append(whole)
    pixels = torch.from_numpy(np.stack([(part / 255.0 - mean) / std for part in parts])).permute(0, 3, 1, 2)
    image_token = _image_token(config)
    needed = ["<fake_token_around_image>", "<global-img>"] + [
        f"<row_{r + 1}_col_{c + 1}>" for r in range(rows) for c in range(columns) if split]
    missing = [token for token in needed if tokenizer.token_to_id(token) is None]
    if missing:
        raise ValueError(f"the tokenizer has no {missing[0]!r} token, which {config.model_type}'s image layout needs")
    fake, global_image = tokenizer.token_to_id(needed[0]), tokenizer.token_to_id(needed[1])
    newline = tokenizer.encode("\n", add_special_tokens=False).ids
    block: list[int] = []
    tiles: list[Tile] = []
    owner: list[int] = []  # per image token: its tile
    for r in range(rows if split else 0):
        for c in range(columns):
            block += [fake, tokenizer.token_to_id(f"<row_{r + 1}_col_{c + 1}>")] + [image_token] * per_tile
            owner += [-2, -2] + [len(tiles)] * per_tile
            tiles.append(Tile(f"tile {r + 1},{c + 1}", (r * tile_size, c * tile_size, (r + 1) * tile_size,
                                                       (c + 1) * tile_size), (side, side)))
        block += newline
        owner += [-2] * len(newline)
    if split:
        block += newline
        owner += [-2] * len(newline)
    block += [fake, global_image] + [image_token] * per_tile + [fake]
    owner += [-2, -2] + [len(tiles)] * per_tile + [-2]
    tiles.append(Tile("whole image", (0, 0, rows * tile_size, columns * tile_size), (side, side)))
    ids, start = _prompt_ids(tokenizer, prompt, block, image_token)
    owner_tensor = torch.tensor(owner)
    inside = torch.nonzero(owner_tensor >= 0).flatten()
    cell = torch.arange(len(inside)) % per_tile
    tokens = ImageTokens(start + inside, owner_tensor[inside], cell // side, cell % side, tiles, picture / 255.0)
    ids_tensor = torch.tensor([ids])
    inputs = {"input_ids": ids_tensor, "attention_mask": torch.ones_like(ids_tensor), "pixel_values": pixels[None]}
    return VisionLanguageInputs(inputs, tokens)


def _tile_sizes(height: int, width: int, longest: int, tile: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(height, width)`` after each of ``Idefics3ImageProcessor``'s two resizes: the longer side
    to ``longest`` (the other in proportion, made even), then the longer side rounded up to whole
    tiles and the other derived from it, rounded up too."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    first = max(height, 1), max(width, 1)
    height, width = first
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return first, (max(height, tile), max(width, tile))


@dataclass
class WordAttention:
    """What each generated token looked at.

    Attributes:
        tokens: the generated tokens' strings.
        ids: their ids.
        image: ``[new, N]`` each new token's attention over the image tokens (the row of the
            position that predicted it), averaged over the heads and the layers asked for.
        image_share: ``[new]`` the share of that row's attention on image tokens.
        layers: the language model's layers averaged (attnlab's names).
    """

    tokens: list[str]
    ids: list[int]
    image: Tensor
    image_share: Tensor
    layers: list[str]


def _language_sites(model: nn.Module) -> list:
    from ._sites import attention_sites

    inner = _unwrap(model)
    decoder = inner.get_decoder() if hasattr(inner, "get_decoder") else None
    members = {id(module) for module in decoder.modules()} if decoder is not None else set()
    return [site for site in attention_sites(inner) if not site.cross and id(site.module) in members]


def generated_word_attention(model: nn.Module, tokenizer: Any, prepared: VisionLanguageInputs, *,
                             max_new_tokens: int = 8, layers: Optional[Sequence[int]] = None) -> WordAttention:
    """Generate greedily, then give each new token's attention over the image tokens.

    The weights come from one forward over the prompt and the new tokens (causal attention:
    row ``p`` is what the model computed when it predicted token ``p + 1``), with exact
    weights on the language model's layers only.

    Args:
        layers: the language model's layers to average, counted from 1 (default all).
    """
    from .backend import attach

    inner = _unwrap(model)
    sites = _language_sites(inner)
    if not sites:
        raise ValueError(f"{type(inner).__name__}: no language-model attention layer found")
    chosen = sites if layers is None else [sites[layer - 1] for layer in layers if 1 <= layer <= len(sites)]
    if layers is not None and len(chosen) != len(layers):
        wrong = next(layer for layer in layers if not 1 <= layer <= len(sites))
        raise ValueError(f"layer {wrong} does not exist: the language model has {len(sites)} layers (1..{len(sites)})")
    inputs = prepared.inputs
    prompt_length = inputs["input_ids"].shape[1]
    context = getattr(inner.config.get_text_config(), "max_position_embeddings", None)
    if isinstance(context, int) and prompt_length + max_new_tokens > context:
        raise ValueError(f"the prompt holds {prompt_length} tokens with the image's, and {max_new_tokens} new tokens "
                         f"would pass the language model's {context} positions; ask for at most "
                         f"{max(context - prompt_length, 0)}")
    eos = getattr(getattr(inner, "generation_config", None), "eos_token_id", None)
    with torch.no_grad():
        sequence = inner.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=eos if isinstance(eos, int) else 0)
    new = sequence[0, prompt_length:]
    if len(new) == 0:
        raise ValueError("the model generated no token")
    ids = sequence[:, :-1]
    forward = {**inputs, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for name, value in inputs.items():  # per-token inputs (Qwen2-VL's mm_token_type_ids): text for new tokens
        if name not in forward or name in ("input_ids", "attention_mask") or value.dim() != 2:
            continue
        if value.shape == (1, prompt_length):
            forward[name] = torch.cat([value, value.new_zeros(1, ids.shape[1] - prompt_length)], dim=1)
    with torch.no_grad(), attach(inner, layers=[site.name for site in chosen]) as seen:
        inner(**forward)
    rows = torch.arange(prompt_length - 1, prompt_length - 1 + len(new))
    positions = prepared.image_tokens.positions
    stacked = torch.stack([seen.attentions[site.name][0].float().mean(0)[rows] for site in chosen]).mean(0)
    return WordAttention(
        tokens=[tokenizer.id_to_token(int(token)) or str(int(token)) for token in new],
        ids=[int(token) for token in new],
        image=stacked[:, positions],
        image_share=stacked[:, positions].sum(-1),
        layers=[site.name for site in chosen],
    )


def word_attention_json(words: WordAttention, tokens: ImageTokens, path: Union[str, Path], **header: Any) -> Path:
    """``vision_language.json``: the tiles, then each generated token's share of attention on the
    image and the cell it looked at most."""
    entries = []
    for index, token in enumerate(words.tokens):
        weights = words.image[index]
        top = int(weights.argmax())
        tile = int(tokens.tile[top])
        entries.append({
            "token": token, "id": words.ids[index], "image_share": round(float(words.image_share[index]), 6),
            "most_attended": {"tile": tokens.tiles[tile].name if tile >= 0 else "class token",
                              "row": int(tokens.row[top]) + 1, "column": int(tokens.column[top]) + 1,
                              "weight": round(float(weights[top]), 6)},
        })
    document = {**header, "layers": words.layers,
                "tiles": [{"name": tile.name, "box": list(tile.box), "grid": list(tile.grid)} for tile in tokens.tiles],
                "image_tokens": int(len(tokens.positions)), "generated": entries}
    write_json(path, document)
    return Path(path)
