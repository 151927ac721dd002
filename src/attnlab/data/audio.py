"""Audio: a PCM WAV file read with the standard library's ``wave`` (:func:`read_wav`: 8, 16, 24
or 32 bits, any number of channels, averaged to mono), and resampled linearly to another rate
(:func:`resample`). Nothing here imports transformers."""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Union

import numpy as np

__all__ = ["read_wav", "resample"]


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


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear interpolation to ``target`` samples a second."""
    if rate == target:
        return samples
    count = max(1, int(round(len(samples) * target / rate)))
    times = np.arange(count, dtype=np.float64) * rate / target
    return np.interp(times, np.arange(len(samples), dtype=np.float64), samples).astype(np.float32)
