"""The error raised for unusable data files."""

from __future__ import annotations

__all__ = ["DataError"]


class DataError(ValueError):
    """A data file or data set that cannot be used; the message says why and where."""
