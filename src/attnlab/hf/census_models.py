"""How the census builds a tiny random model of an architecture and the inputs it runs on.

Dimension letters: ``B`` batch, ``T`` length.

:func:`shrink` sets every size a config names to one small value (the rule), then derives
again the sizes its ``__init__`` derives from others; :func:`model_inputs` gives the forms a
model's inputs may take (token ids, pixels, video frames, flattened patches on a grid, raw
audio, spectrograms either way round), in the order :func:`runnable` tries them.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import Tensor, nn

__all__ = ["EXTRA_INPUTS", "OVERRIDES", "REAL_SETTINGS", "NotBuilt", "model_inputs", "runnable", "shrink"]

VOCAB, B, T, IMAGE, FRAMES = 99, 2, 8, 32, 16


# The rule: every size a config names is set to the census's small value. Counts of layers
# and heads, widths, vocabulary, images; names as transformers' configs spell them.
_SIZES = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers", "num_encoder_layers", "depth"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "num_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads"), 2),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "projection_dim"), 32),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim",
                     "n_inner", "moe_intermediate_size", "shared_expert_intermediate_size"), 64),
    **dict.fromkeys(("head_dim", "d_kv", "kv_channels", "qk_nope_head_dim", "v_head_dim"), 8),
    "qk_rope_head_dim": 4, "kv_lora_rank": 16, "q_lora_rank": 16,
    "vocab_size": VOCAB, "image_size": IMAGE, "patch_size": 8,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "initializer_range": 0.2, "max_position_embeddings": 64, "embedding_size": 32,
    "rotary_dim": 4, "num_frames": 2, "out_hidden_size": 32, "mm_tokens_per_image": 4,
}
# Per-architecture overrides, only where the rule cannot work (each says why).
OVERRIDES: dict[str, dict[str, Any]] = {}
# Settings an architecture's real checkpoints have where its config class's defaults differ
# (each says why): the census tries the model users open.
REAL_SETTINGS: dict[str, dict[str, Any]] = {
    # Gemma 3's checkpoints have no SigLIP pooling head (vision_use_head false); the class's
    # default builds one (an nn.MultiheadAttention, which attnlab refuses) that they never run
    "gemma3": {"vision_config.vision_use_head": False},
}
# Inputs beyond the main one, where a forward is random without them.
EXTRA_INPUTS = {
    # ViTMAE shuffles and masks patches by a noise it draws at every call unless it is given one
    "vit_mae": lambda inputs: {"noise": torch.rand(B, (IMAGE // 8) ** 2, generator=torch.Generator().manual_seed(1))},
}


def real_settings(config: Any, model_type: str) -> Any:
    """``config`` with :data:`REAL_SETTINGS`'s values for ``model_type`` (``"vision_config.x"``: a sub-config's)."""
    for dotted, value in REAL_SETTINGS.get(model_type, {}).items():
        *path, name = dotted.split(".")
        owner = config
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, value)
    return config


def shrink(config: Any, overrides: Optional[dict] = None) -> Any:
    """Set every size ``config`` (and each of its sub-configs) names to the census's value."""
    from transformers import PretrainedConfig

    for name, value in {**_SIZES, **(overrides or {})}.items():
        if name not in config.__dict__:
            continue
        current = config.__dict__[name]
        number = isinstance(current, (int, float)) and not isinstance(current, bool)
        if number or (current is None and name in ("num_key_value_heads", "head_dim")):  # None: derived later
            setattr(config, name, value)
    for name, value in list(config.__dict__.items()):  # special tokens (Whisper's pad is 50256) in the vocabulary
        if name.endswith(("_token_id", "_token_index")) and isinstance(value, int) and value >= VOCAB:
            setattr(config, name, _special_token(name))
        elif name.endswith("_token_id") and isinstance(value, list):
            setattr(config, name, [v if v < VOCAB else 1 for v in value if isinstance(v, int)])
    if isinstance(getattr(config, "layer_types", None), list) and config.layer_types:
        config.layer_types = _layer_types(config.layer_types, _layers(config))
    _derived_sizes(config)
    for name, value in list(config.__dict__.items()):
        if isinstance(value, PretrainedConfig):
            shrink(value, overrides)
    return config


def _layer_types(kinds: list, layers: int) -> list:
    """The first ``layers`` kinds of layer, the last ones replaced by any kind they leave out
    (Qwen3.5's three linear-attention layers before each full one: 2 layers keep one of each)."""
    kept = (list(kinds) * layers)[:layers]
    missing = [kind for kind in dict.fromkeys(kinds) if kind not in kept]
    if missing and len(missing) < layers:
        kept[layers - len(missing):] = missing
    return kept


def _derived_sizes(config: Any) -> None:
    """Sizes a config's ``__init__`` derives from others, derived again from the shrunk ones."""
    sizes = config.__dict__
    if isinstance(sizes.get("qk_rope_head_dim"), int) and isinstance(sizes.get("qk_nope_head_dim"), int):
        # multi-head latent attention: rotary on the rope part,
        if isinstance(sizes.get("num_key_value_heads"), int):  # keys and values for every head (no grouping)
            config.num_key_value_heads = config.num_attention_heads
        if "head_dim" in sizes:
            config.head_dim = config.qk_rope_head_dim
        if "qk_head_dim" in sizes:
            config.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
    if isinstance(sizes.get("num_heads"), (list, tuple)):  # Swin's heads per stage: each stage's width must divide
        config.num_heads = type(config.num_heads)([2] * len(config.num_heads))
    if isinstance(sizes.get("image_grid_pinpoints"), list):  # LLaVA-NeXT's tiles: one tile of the shrunk image
        config.image_grid_pinpoints = [[IMAGE, IMAGE]]
    rope = sizes.get("rope_parameters")
    if isinstance(rope, dict) and ("mrope_section" in rope or "mrope_section" in getattr(
            type(config), "ignore_keys_at_rope_validation", ())):
        rope["mrope_section"] = [2, 1, 1]  # sections of a head's rotary half (head_dim 8: 4) for time, height, width


def _special_token(name: str) -> int:
    """A special token's id in the shrunk vocabulary: image, video and audio tokens at its end."""
    for word, place in (("image", VOCAB - 1), ("video", VOCAB - 2), ("audio", VOCAB - 3), ("pad", 0)):
        if word in name:
            return place
    return 1


def _layers(config: Any) -> int:
    return next((getattr(config, name) for name in ("num_hidden_layers", "num_layers", "n_layer")
                 if isinstance(getattr(config, name, None), int)), 2)


def model_inputs(model: nn.Module, config: Any) -> list[dict[str, Tensor]]:
    """Inputs of the model's main kind (token ids, pixels or audio features), ``B = 2``: the
    forms it may take, in the order tried (:func:`runnable` keeps the first that runs)."""
    generator = torch.Generator().manual_seed(0)
    main = getattr(model, "main_input_name", "input_ids")
    text_config = getattr(config, "text_config", None) or config
    vocab = getattr(text_config, "vocab_size", None) or VOCAB
    if main == "input_ids":
        ids = torch.randint(3, max(vocab, 4), (B, T), generator=generator)
        forms = [{"input_ids": ids, "attention_mask": torch.ones(B, T, dtype=torch.long)}]
    elif main in ("pixel_values", "pixel_values_videos"):
        vision = getattr(config, "vision_config", None) or config
        channels = getattr(vision, "num_channels", 3)
        size = getattr(vision, "image_size", IMAGE)
        size = size if isinstance(size, int) else IMAGE
        pixels = torch.randn(B, channels, size, size, generator=generator)
        frames = getattr(vision, "num_frames", None)
        video = {main: pixels[:, None].expand(B, frames, channels, size, size).contiguous()} if frames else None
        forms = [form for form in (video, {main: pixels}) if form is not None]  # a video model: frames first
    elif main == "input_values":  # raw audio (wav2vec 2.0, HuBERT): a tenth of a second at 16 kHz
        audio = torch.randn(B, 1600, generator=generator)
        forms = [{"input_values": audio}, {"input_values": audio[:, None]}]  # or one channel: [B, 1, samples]
    elif main == "input_features":
        forms = _audio_features(config, generator)
    else:
        raise NotBuilt(f"its main input {main!r} is not one the census makes (token ids, pixels, audio features)")
    for inputs in forms:
        if getattr(config, "is_encoder_decoder", False):
            inputs["decoder_input_ids"] = torch.randint(3, max(vocab, 4), (B, T // 2), generator=generator)
    vision = getattr(config, "vision_config", None)
    if main == "input_ids" and vision is not None:
        size = getattr(vision, "image_size", IMAGE)
        size = size if isinstance(size, int) else IMAGE
        pixels = torch.randn(B, getattr(vision, "num_channels", 3), size, size, generator=generator)
        image_token = next((getattr(config, name) for name in ("image_token_id", "image_token_index")
                            if isinstance(getattr(config, name, None), int)), None)
        if image_token is not None:  # a vision-language model: as many image tokens as image features
            forms[0].update(_image_tokens(model, vision, pixels, image_token, forms[0]["input_ids"], vocab))
        else:  # two towers (CLIP, SigLIP): a text and its image (X-CLIP: its video)
            frames = getattr(vision, "num_frames", None)
            forms[0]["pixel_values"] = pixels[:, None].expand(B, frames, *pixels.shape[1:]) if frames else pixels
    return forms


def _audio_features(config: Any, generator: torch.Generator) -> list[dict[str, Tensor]]:
    """Spectrogram features: ``[B, bins, frames]`` (Whisper) or ``[B, frames, bins]`` (Speech2Text,
    Parakeet), with the bins found in the config or its audio, encoder or speech sub-config."""
    owners = [config] + [getattr(config, name) for name in ("audio_config", "encoder_config", "speech_config")
                         if getattr(config, name, None) is not None]
    bins = next((getattr(owner, name) for owner in owners for name in ("num_mel_bins", "feature_size",
                                                                          "feature_projection_input_dim")
                 if isinstance(getattr(owner, name, None), int)), None)
    if bins is None and isinstance(getattr(config, "input_feat_per_channel", None), int):  # Speech2Text
        bins = config.input_feat_per_channel * getattr(config, "input_channels", 1)
    if bins is None:
        raise NotBuilt("its main input 'input_features' has a size the census does not find in its config")
    short = torch.randn(B, bins, 4 * FRAMES, generator=generator)
    forms = []
    for features in (short, _whisper_length(config, bins, generator)):
        if features is None:
            continue
        frames, across = features.shape[-1], features.transpose(1, 2).contiguous()
        mask = torch.ones(B, frames, dtype=torch.long)
        forms += [{"input_features": features}, {"input_features": across},
                  {"input_features": features, "input_features_mask": mask},
                  {"input_features": across, "input_features_mask": mask},
                  {"input_features": across, "attention_mask": mask}]
    return forms


def _whisper_length(config: Any, bins: int, generator: torch.Generator) -> Optional[Tensor]:
    """Whisper's encoder takes exactly twice its positions in frames (3000: 30 s); tried after
    the short form, and only where that stays small."""
    positions = getattr(config, "max_source_positions", None)
    if not isinstance(positions, int) or 2 * positions > 3000:
        return None
    return torch.randn(B, bins, 2 * positions, generator=generator)


class NotBuilt(Exception):
    pass


def runnable(model: nn.Module, forms: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The first form of the inputs the model runs on; the first form's error when none does."""
    first: Optional[Exception] = None
    for inputs in forms:
        try:
            run(model, inputs)
            return inputs
        except Exception as error:  # noqa: BLE001  the next form, or this architecture's verdict
            first = first or error
    raise NotBuilt(f"its forward failed: {type(first).__name__}: {first_line(first)}")


def _image_forms(vision: Any, pixels: Tensor) -> list[dict[str, Tensor]]:
    """The forms a vision-language model's images come in: ``[B, C, H, W]``; one image per text
    (``[B, 1, C, H, W]``: Idefics, SmolVLM); sizes beside (LLaVA-NeXT); or flattened patches on a
    grid (Qwen2-VL: ``[B * t * h * w, C * t_patch * patch²]`` and ``image_grid_thw``)."""
    size = pixels.shape[-1]
    sizes = torch.tensor([[size, size]] * B)
    tiles = torch.stack([pixels, pixels.flip(-1)], dim=1)  # LLaVA-NeXT: the whole image and one tile
    forms = [{"pixel_values": pixels}, {"pixel_values": pixels[:, None]},
             {"pixel_values": tiles, "image_sizes": sizes}, {"pixel_values": pixels, "image_sizes": sizes}]
    patch = getattr(vision, "patch_size", 14)
    patch = patch if isinstance(patch, int) else 14
    merge = getattr(vision, "spatial_merge_size", 1) or 1
    temporal = getattr(vision, "temporal_patch_size", 1) or 1
    channels = getattr(vision, "in_channels", None) or getattr(vision, "num_channels", 3)
    side = 2 * merge  # four image tokens per image once merged
    grid = torch.tensor([[1, side, side]] * B)
    flat = torch.randn(B * side * side, channels * temporal * patch * patch, generator=torch.Generator().manual_seed(2))
    forms.append({"pixel_values": flat, "image_grid_thw": grid})
    return forms


def _image_tokens(model: nn.Module, vision: Any, pixels: Tensor, image_token: int, text: Tensor, vocab: int) -> dict:
    """A vision-language model's inputs: each text after as many image tokens as its image has
    features (what ``get_image_features`` returns for the first form of the image it takes)."""
    if image_token >= vocab:
        raise NotBuilt(f"its image token {image_token} lies past the shrunk vocabulary of {vocab}")
    first: Optional[Exception] = None
    for form in _image_forms(vision, pixels):
        try:
            with torch.no_grad():
                features = model.get_image_features(**form)
            break
        except Exception as error:  # noqa: BLE001  the next form, or a tower that needs more
            first = first or error
    else:
        raise NotBuilt(f"a vision-language model whose image features need more than pixels "
                        f"({type(first).__name__}: {first_line(first)})")
    features = getattr(features, "pooler_output", features)
    if isinstance(features, (tuple, list)):
        count = sum(int(part.shape[-2]) if part.dim() > 1 else 1 for part in features) // B
    elif isinstance(features, Tensor):
        count = int(features.shape[-2]) if features.dim() == 3 else int(features.shape[0]) // B
    else:
        raise NotBuilt("a vision-language model whose image features the census cannot count")
    text = torch.randint(3, VOCAB - 3, text.shape, generator=torch.Generator().manual_seed(0))  # no special id
    ids = torch.cat([torch.full((B, count), image_token), text], dim=1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **form}
    accepted = inspect.signature(model.forward).parameters
    for name in ("mm_token_type_ids", "token_type_ids"):  # 1 on image tokens, as the processors give
        if name in accepted:  # (Gemma 3 lets an image's tokens see each other; Qwen2-VL places them on its grid)
            inputs[name] = (ids == image_token).long()
    return inputs


def run(model: nn.Module, inputs: dict, **options: Any) -> Any:
    with torch.no_grad():
        return model(**inputs, **options)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:200]
