"""Speech models (Whisper): a WAV file to the encoder's input features, and a greedy transcript.

Dimension letters: ``C`` mel channels, ``F`` feature frames, ``S`` encoder positions, ``G``
generated tokens.

The WAV file is read by :func:`attnlab.data.audio.read_wav` (the standard library's ``wave``:
PCM, 8, 16, 24 or 32 bits, any number of channels, averaged to mono) and resampled linearly to
the rate the feature extractor expects. The features come from the model directory's own
feature extractor (``preprocessor_config.json``, read by transformers' ``AutoFeatureExtractor``):
Whisper's log-mel spectrogram padded or cut to its window. A directory without that file gets a
``WhisperFeatureExtractor`` built from ``config.json`` (``num_mel_bins`` channels, a window of
``2 * max_source_positions`` frames of 10 ms at 16 kHz).

The encoder halves the frames (its second convolution has stride 2): encoder position ``s``
covers ``2 * hop_length / sampling_rate`` seconds from ``s`` times that (20 ms for Whisper).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor, nn

from .._moved import moved_names
from ..data.audio import resample

__all__ = ["AudioFeatures", "audio_features", "greedy_target", "speech_prompt"]


@dataclass
class AudioFeatures:
    """A clip's encoder input and what its positions cover.

    Attributes:
        features: ``[C, F]`` (Whisper's ``input_features`` of one example).
        seconds_per_position: the time one encoder position covers.
        seconds: the clip's length (before padding).
    """

    features: Tensor
    seconds_per_position: float
    seconds: float

    @property
    def positions(self) -> int:
        """The encoder positions the clip covers (at least 1; the rest of the window is padding)."""
        return max(1, int(self.seconds / self.seconds_per_position + 1e-6))

    def position_labels(self, count: int) -> list[str]:
        """``["0.00s", "0.02s", ...]``: the start time of each of ``count`` encoder positions."""
        return [f"{index * self.seconds_per_position:.2f}s" for index in range(count)]


def _feature_extractor(directory: Union[str, Path], config: Any) -> Any:
    import transformers

    if (Path(directory) / "preprocessor_config.json").is_file():
        return transformers.AutoFeatureExtractor.from_pretrained(directory)
    positions = getattr(config, "max_source_positions", None)
    mel_bins = getattr(config, "num_mel_bins", None)
    if not isinstance(positions, int) or not isinstance(mel_bins, int) or positions % 50:
        raise ValueError(f"{directory} holds no preprocessor_config.json (the feature extractor's settings) and its "
                         f"config does not give Whisper's window; save the model's processor with it")
    return transformers.WhisperFeatureExtractor(feature_size=mel_bins, chunk_length=positions // 50)


def audio_features(directory: Union[str, Path], model: nn.Module, samples: np.ndarray, rate: int) -> AudioFeatures:
    """The encoder input of a clip, as the model directory's feature extractor makes it.

    Args:
        directory: the model directory (its ``preprocessor_config.json``).
        model: the transformers speech model (its config, when that file is missing).
        samples: mono samples in ``[-1, 1]``; ``rate``: samples a second.

    Raises:
        ValueError: the clip is longer than the model's window (it would be cut silently).
    """
    extractor = _feature_extractor(directory, model.config)
    target = int(getattr(extractor, "sampling_rate", 16000))
    samples = resample(np.asarray(samples, dtype=np.float32), int(rate), target)
    window = getattr(extractor, "n_samples", None)
    if isinstance(window, int) and len(samples) > window:
        raise ValueError(f"the clip lasts {len(samples) / target:.2f} s, longer than the model's window of "
                         f"{window / target:g} s; cut it first")
    batch = extractor(samples, sampling_rate=target, return_tensors="np")
    features = torch.from_numpy(np.asarray(batch["input_features"][0], dtype=np.float32))  # [C, F]
    hop = int(getattr(extractor, "hop_length", 160))
    return AudioFeatures(features, 2 * hop / target, len(samples) / target)


def speech_prompt(model: nn.Module) -> list[int]:
    """The decoder's prompt for a transcript without timestamps: the start token, then the tokens the
    generation config forces (``forced_decoder_ids``: Whisper's language and task) or, without those,
    its ``no_timestamps_token_id``. A model whose config names neither gets its start token alone.
    """
    from .seq2seq import decoder_start

    prompt = [decoder_start(model)]
    generation = getattr(model, "generation_config", None)
    forced = getattr(generation, "forced_decoder_ids", None) or []
    for position, token in sorted(forced):
        if position == len(prompt) and isinstance(token, int):
            prompt.append(token)
    no_timestamps = getattr(generation, "no_timestamps_token_id", None)
    if isinstance(no_timestamps, int) and no_timestamps not in prompt:
        prompt.append(no_timestamps)
    return prompt


def _suppressed(model: nn.Module, prompt: Sequence[int], vocabulary: int) -> tuple[Tensor, Tensor]:
    """Boolean ``[V]`` masks of the tokens never chosen and of those not chosen first (the generation
    config's ``suppress_tokens`` and ``begin_suppress_tokens``; timestamp tokens after the no-timestamps
    token)."""
    generation = getattr(model, "generation_config", None)
    always, first = torch.zeros(vocabulary, dtype=torch.bool), torch.zeros(vocabulary, dtype=torch.bool)
    always[[t for t in getattr(generation, "suppress_tokens", None) or [] if 0 <= t < vocabulary]] = True
    first[[t for t in getattr(generation, "begin_suppress_tokens", None) or [] if 0 <= t < vocabulary]] = True
    no_timestamps = getattr(generation, "no_timestamps_token_id", None)
    if isinstance(no_timestamps, int) and no_timestamps in prompt:
        always[no_timestamps + 1:] = True  # Whisper's timestamp tokens follow it
    return always, first


def greedy_target(model: nn.Module, source_features: Tensor, *, start: Optional[int] = None,
                  prompt: Optional[Sequence[int]] = None, max_new_tokens: int = 20) -> Tensor:
    """``[K + G]``: the decoder's prompt (``prompt``, else ``[start]``) and the tokens a speech model
    picks greedily, one forward per token, until its end token or ``max_new_tokens``. Tokens the
    generation config suppresses are never picked (see :func:`speech_prompt` for Whisper's prompt).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if (prompt is None) == (start is None):
        raise ValueError("give the decoder's start token (start=) or its whole prompt (prompt=), one of them")
    prompt = [int(start)] if prompt is None else [int(token) for token in prompt]
    end = getattr(model.config, "eos_token_id", None)
    ids = torch.tensor(prompt)
    with torch.no_grad():
        encoded = model.get_encoder()(input_features=source_features[None].to(next(model.parameters()).dtype))
        for step in range(max_new_tokens):
            logits = model(encoder_outputs=encoded, decoder_input_ids=ids[None], use_cache=False).logits  # [1, T, V]
            scores = logits[0, -1].float()
            if step == 0:
                always, first = _suppressed(model, prompt, scores.numel())
                scores = scores.masked_fill(first, float("-inf"))
            chosen = int(scores.masked_fill(always, float("-inf")).argmax())
            ids = torch.cat([ids, torch.tensor([chosen])])
            if chosen == end:
                break
    return ids


__getattr__ = moved_names(__name__)  # read_wav: attnlab.data.audio
