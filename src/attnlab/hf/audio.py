"""Speech models (Whisper): a WAV file to the encoder's input features, and a greedy transcript.

Dimension letters: ``C`` mel channels, ``F`` feature frames, ``S`` encoder positions, ``G``
generated tokens.

The WAV file is read with the standard library's ``wave`` (PCM, 8, 16, 24 or 32 bits, any
number of channels, averaged to mono) and resampled linearly to the rate the feature
extractor expects. The features come from the model directory's own feature extractor
(``preprocessor_config.json``, read by transformers' ``AutoFeatureExtractor``): Whisper's
log-mel spectrogram padded or cut to its window. A directory without that file gets a
``WhisperFeatureExtractor`` built from ``config.json`` (``num_mel_bins`` channels, a window of
``2 * max_source_positions`` frames of 10 ms at 16 kHz).

The encoder halves the frames (its second convolution has stride 2): encoder position ``s``
covers ``2 * hop_length / sampling_rate`` seconds from ``s`` times that (20 ms for Whisper).
"""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["AudioFeatures", "audio_features", "greedy_target", "read_wav"]


def read_wav(path: Union[str, Path], *, argument: str = "--audio") -> tuple[np.ndarray, int]:
    """``(samples, rate)``: a PCM WAV file as mono float32 in ``[-1, 1]``.

    Raises:
        FileNotFoundError: no such file. ValueError: not a PCM WAV file the standard library reads.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{argument} {str(path)!r}: no such file")
    try:
        with wave.open(str(path), "rb") as reader:
            channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
            frames = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as error:
        raise ValueError(f"{argument} {str(path)!r} is not a PCM WAV file ({error})") from None
    if width == 1:
        samples = (np.frombuffer(frames, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        raw = np.frombuffer(frames, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        samples = (np.where(values >= 1 << 23, values - (1 << 24), values)).astype(np.float32) / float(1 << 23)
    elif width == 4:
        samples = np.frombuffer(frames, dtype="<i4").astype(np.float32) / float(1 << 31)
    else:
        raise ValueError(f"{argument} {str(path)!r}: {8 * width}-bit samples; attnlab reads 8, 16, 24 or 32-bit PCM")
    if samples.size == 0:
        raise ValueError(f"{argument} {str(path)!r} holds no samples")
    return samples.reshape(-1, channels).mean(1), rate


def _resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear interpolation to ``target`` samples a second."""
    if rate == target:
        return samples
    count = max(1, int(round(len(samples) * target / rate)))
    times = np.arange(count, dtype=np.float64) * rate / target
    return np.interp(times, np.arange(len(samples), dtype=np.float64), samples).astype(np.float32)


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
    samples = _resample(np.asarray(samples, dtype=np.float32), int(rate), target)
    window = getattr(extractor, "n_samples", None)
    if isinstance(window, int) and len(samples) > window:
        raise ValueError(f"the clip lasts {len(samples) / target:.2f} s, longer than the model's window of "
                         f"{window / target:g} s; cut it first")
    batch = extractor(samples, sampling_rate=target, return_tensors="np")
    features = torch.from_numpy(np.asarray(batch["input_features"][0], dtype=np.float32))  # [C, F]
    hop = int(getattr(extractor, "hop_length", 160))
    return AudioFeatures(features, 2 * hop / target, len(samples) / target)


def greedy_target(model: nn.Module, source_features: Tensor, *, start: int, max_new_tokens: int = 20) -> Tensor:
    """``[1 + G]``: the start token and the tokens a speech model picks greedily, one forward per
    token, until its end token or ``max_new_tokens`` (no forced language or task tokens, no
    timestamp rules: the model's own first choices).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    end = getattr(model.config, "eos_token_id", None)
    ids = torch.tensor([start])
    with torch.no_grad():
        encoded = model.get_encoder()(input_features=source_features[None].to(next(model.parameters()).dtype))
        for _ in range(max_new_tokens):
            logits = model(encoder_outputs=encoded, decoder_input_ids=ids[None], use_cache=False).logits  # [1, T, V]
            chosen = int(logits[0, -1].argmax())
            ids = torch.cat([ids, torch.tensor([chosen])])
            if chosen == end:
                break
    return ids
