"""Argument checks shared by the public constructors."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, TypeVar

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


def machine_memory() -> Optional[int]:
    """Bytes of physical memory of this machine; ``None`` where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def gib(nbytes: float) -> str:
    """``nbytes`` for people: ``"74.5 GiB"``."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def check_memory(nbytes: float, what: str, fix: str) -> None:
    """Refuse, before allocating, what would take more than half of this machine's memory.

    Args:
        nbytes: the estimate.
        what: what needs it, with the setting that decides it (``"max_len=10**9"``).
        fix: what to do instead.

    Raises:
        ValueError: one line with the estimate, the machine's memory and ``fix``.
    """
    memory = machine_memory()
    if memory is not None and nbytes > memory / 2:
        raise ValueError(f"{what} needs about {gib(nbytes)} of memory, more than half of this machine's "
                         f"{gib(memory)}; {fix}")
