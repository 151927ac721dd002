"""Argument checks shared by the public constructors."""

from __future__ import annotations


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is an int > 0, else raise a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_probability(name: str, value: object) -> float:
    """Return ``value`` as a float if it lies in [0, 1), else raise a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)
