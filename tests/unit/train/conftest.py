import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny_run import tiny_dataset, tiny_model  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models gain nothing from a second thread, and OpenMP threads stall badly
    # when another process keeps the cores busy.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def dataset():
    return tiny_dataset()


@pytest.fixture
def make_model():
    return tiny_model
