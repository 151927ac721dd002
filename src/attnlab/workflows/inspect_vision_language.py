"""``attnlab inspect --image X --prompt P`` on a vision-language model: what each generated word
looked at in the picture (``words_on_image.png``, ``vision_language.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    from ..hf.placement import Placement

__all__ = ["VisionLanguageInspection", "open_vision_language_model", "refuse_unlaid_vision_language",
           "vision_language_type",
           "write_vision_language_inspection"]


@dataclass
class VisionLanguageInspection:
    """What :func:`write_vision_language_inspection` wrote.

    Attributes:
        tokens: the generated tokens.
        tiles: the tiles' names, in the order their image tokens come.
        image_tokens: how many image tokens the prompt held.
        figures: the PNG and the JSON written.
    """

    tokens: list[str]
    tiles: list[str]
    image_tokens: int
    figures: list[Path]


def vision_language_type(directory: str) -> Optional[str]:
    """The ``model_type`` of the vision-language model in ``directory`` (a text and a vision
    config with an image token), or ``None`` (another model, or no readable config.json)."""
    from .resolve import directory_config

    config = directory_config(directory)
    if config is None or "vision_config" not in config or "text_config" not in config:
        return None
    if not any(key in config for key in ("image_token_id", "image_token_index")):
        return None
    return str(config.get("model_type", "vision-language"))


def refuse_unlaid_vision_language(directory: str, model_type: str) -> None:
    """One line for a vision-language model of a family whose image tokens attnlab does not lay out."""
    from ..hf.vision_language import FAMILIES

    if model_type not in FAMILIES:
        raise ValueError(f"{directory} is a vision-language model ({model_type}); attnlab lays out the image tokens "
                         f"of {', '.join(FAMILIES)} only, so it cannot draw this one's words over the picture")


def open_vision_language_model(directory: str, *, dtype: str, placement: Optional["Placement"] = None
                               ) -> tuple[Any, Any, Any, Optional[dict]]:
    """The model, its tokenizer, LLaVA's image preprocessing (``None`` otherwise) and a tiled
    family's processor settings (``preprocessor_config.json``; ``None`` otherwise)."""
    from .._files import read_json
    from ..checkpoints.encoders.loading import load_tokenizer
    from ..data.images import FILE_NAME, read_image_preprocessing
    from ..hf.opening import is_transformers_only, open_transformers
    from ..hf.vision_language import FAMILIES, is_vision_language

    language = vision_language_type(directory)
    if language is not None:
        refuse_unlaid_vision_language(directory, language)
    if not Path(directory).is_dir() or not is_transformers_only(directory):
        raise ValueError(f"--prompt with --image takes a transformers vision-language model directory "
                         f"({', '.join(FAMILIES)}); {directory} is not one")
    model = open_transformers(directory, dtype=dtype, placement=placement)
    if not is_vision_language(model):
        raise ValueError(f"--prompt with --image needs a vision-language model ({', '.join(FAMILIES)}); "
                         f"{directory} is a {model.config.model_type} model: drop --prompt to draw its image "
                         f"attention")
    tokenizer = load_tokenizer(directory)
    if model.config.model_type == "llava":
        return model, tokenizer, read_image_preprocessing(directory), None
    path = Path(directory) / FILE_NAME
    return model, tokenizer, None, read_json(path) if path.is_file() else None


def write_vision_language_inspection(model: Any, tokenizer: Any, image: Any, prompt: str, out: str, *,
                                     max_new_tokens: int = 8, layers: Optional[Sequence[int]] = None,
                                     preprocessing: Any = None, settings: Optional[dict] = None,
                                     model_name: str = "model", image_name: str = "image") -> VisionLanguageInspection:
    """Generate greedily from ``image`` and ``prompt``; draw and write each new token's
    attention over the picture (mean over heads and the layers asked for)."""
    from ..hf.vision_language import generated_word_attention, vision_language_inputs, word_attention_json
    from ..inspect.draw.image_overlay import plot_word_overlays

    prepared = vision_language_inputs(model, tokenizer, image, prompt, preprocessing=preprocessing,
                                      processor_settings=settings)
    words = generated_word_attention(model, tokenizer, prepared, max_new_tokens=max_new_tokens, layers=layers)
    tokens = prepared.image_tokens
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    which = "all layers" if layers is None else ", ".join(words.layers)
    figure = plot_word_overlays(
        tokens.picture, words.tokens, [tokens.picture_maps(row) for row in words.image],
        out_dir / "words_on_image.png", shares=words.image_share.tolist(), tiles=_tile_grid(tokens.tiles),
        title=f"{model_name}: what each generated token looked at in {image_name} (mean over heads, {which})",
    )
    document = word_attention_json(words, tokens, out_dir / "vision_language.json", model=model_name,
                                   image=image_name, prompt=prompt)
    return VisionLanguageInspection(words.tokens, [tile.name for tile in tokens.tiles], len(tokens.positions),
                                    [figure, document])


def _tile_grid(tiles: list) -> Optional[tuple[int, int]]:
    """``(rows, columns)`` of the cut tiles (``None`` when the picture was not cut)."""
    cut = [tile for tile in tiles if tile.name != "whole image"]
    if not cut:
        return None
    return max(tile.box[2] for tile in cut) // (cut[0].box[2] - cut[0].box[0]), \
        max(tile.box[3] for tile in cut) // (cut[0].box[3] - cut[0].box[1])
