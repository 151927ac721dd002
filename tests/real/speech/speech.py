"""Speech with known word boundaries: espeak-ng says each word alone, its silence is trimmed, and the
words are joined with fixed gaps, so each word's start and end in seconds are known exactly.

``synthesise(words, path)`` writes a 16 kHz mono 16-bit WAV and returns the words' true times.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np

ESPEAK = "espeak-ng"
RATE = 16000
GAP = 0.15  # seconds of silence between words
EDGE = 0.3  # seconds of silence before the first word and after the last
THRESHOLD = 0.02  # |sample| above this counts as speech when trimming


@dataclass(frozen=True)
class TimedWord:
    word: str
    start: float
    end: float


def espeak_available() -> bool:
    return shutil.which(ESPEAK) is not None


def _read(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as reader:
        assert reader.getsampwidth() == 2 and reader.getnchannels() == 1, "espeak-ng writes 16-bit mono"
        rate = reader.getframerate()
        samples = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    return samples, rate


def _resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return samples
    count = int(round(len(samples) * target / rate))
    return np.interp(np.arange(count) * rate / target, np.arange(len(samples)), samples).astype(np.float32)


def _spoken(word: str, directory: Path) -> np.ndarray:
    """One word as espeak-ng says it, resampled to 16 kHz, its leading and trailing silence cut."""
    path = directory / "word.wav"
    subprocess.run([ESPEAK, "-v", "en-us", "-w", str(path), word], check=True, capture_output=True)
    samples, rate = _read(path)
    samples = _resample(samples, rate, RATE)
    loud = np.flatnonzero(np.abs(samples) > THRESHOLD)
    assert loud.size, f"espeak-ng said nothing for {word!r}"
    return samples[loud[0]:loud[-1] + 1]


def synthesise(words: Sequence[str], path: Union[str, Path]) -> list[TimedWord]:
    """Write ``words`` spoken one by one with :data:`GAP` seconds between them; their true times."""
    pieces, timed, cursor = [np.zeros(int(EDGE * RATE), np.float32)], [], int(EDGE * RATE)
    with tempfile.TemporaryDirectory() as scratch:
        for index, word in enumerate(words):
            spoken = _spoken(word, Path(scratch))
            timed.append(TimedWord(word, cursor / RATE, (cursor + len(spoken)) / RATE))
            pieces.append(spoken)
            cursor += len(spoken)
            gap = int((GAP if index < len(words) - 1 else EDGE) * RATE)
            pieces.append(np.zeros(gap, np.float32))
            cursor += gap
    samples = np.concatenate(pieces)
    with wave.open(str(path), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(RATE)
        writer.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return timed


def words_of(text: str) -> list[str]:
    """Lower-case words without punctuation (how a transcript is compared with its reference)."""
    kept = "".join(mark if mark.isalnum() or mark in " '" else " " for mark in text.lower())
    return kept.split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level Levenshtein distance (substitutions, insertions, deletions) over the reference's words."""
    truth, said = words_of(reference), words_of(hypothesis)
    distances = list(range(len(said) + 1))
    for i, word in enumerate(truth, 1):
        diagonal, distances[0] = distances[0], i
        for j, other in enumerate(said, 1):
            diagonal, distances[j] = distances[j], min(distances[j] + 1, distances[j - 1] + 1,
                                                        diagonal + (word != other))
    return distances[-1] / max(1, len(truth))
