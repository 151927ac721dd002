"""Shared test set-up: every test starts from the same random state."""

from __future__ import annotations

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
