"""Shared test set-up: every test starts from the same random state."""

from __future__ import annotations

import shutil

import pytest
import torch
from hypothesis import settings

# Property tests: few examples (the suite must stay fast on a small CPU) and no
# per-example deadline (the first call into a kernel may be slow).
settings.register_profile("attnlab", max_examples=30, deadline=None, derandomize=True)
settings.load_profile("attnlab")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs_cxx`` tests run torch.compile on CPU: skipped without a C++ compiler."""
    compilers = ("c++", "g++", "clang++")
    if item.get_closest_marker("needs_cxx") and not any(shutil.which(name) for name in compilers):
        pytest.skip("torch.compile on CPU needs a C++ compiler")
