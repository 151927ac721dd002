"""The one error of every checkpoint format: :class:`UnsupportedCheckpointError`."""

from __future__ import annotations

from typing import Iterable

__all__ = ["UnsupportedCheckpointError", "problems_error"]


class UnsupportedCheckpointError(ValueError):
    """A checkpoint (or a model to export) that attnlab cannot read or write in that format.

    The message names the file and lists every problem found, not only the first.
    """


def problems_error(what: str, problems: Iterable[str]) -> UnsupportedCheckpointError:
    """One error listing every problem, a line each."""
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return UnsupportedCheckpointError(f"{what}:\n{lines}")
