"""Argument checks shared by the public constructors."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


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


def dataclass_from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Build the dataclass ``cls`` from ``values``, naming any key it does not have."""
    known = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; known keys: {sorted(known)}")
    return cls(**values)
