"""Argument checks shared by the public constructors."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional, Sequence, TypeVar

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


def check_inputs_match(module: Any, what: str, tensors: dict[str, Any], *, dtype: bool = True) -> None:
    """Refuse inputs on another device, or of another floating dtype, than ``module``'s weights.

    torch's own errors ("mat1 and mat2 must have the same dtype", "Expected all tensors to be
    on the same device") name neither the argument nor the fix. Under ``torch.autocast``
    mixed dtypes are the point, so only devices are compared there.

    Args:
        module: the module whose first parameter sets the expected device and dtype.
        what: the module's name in the message (``"MultiHeadAttention"``).
        tensors: ``{argument name: tensor or None}``.
        dtype: compare floating dtypes too (``False`` for token ids).

    Raises:
        ValueError: one line naming the argument, both devices or dtypes, and the fix.
    """
    import torch

    parameter = next(module.parameters(), None)
    if parameter is None:
        return
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor) or parameter.device.type == "meta":
            continue
        if tensor.device != parameter.device:
            raise ValueError(f"{name} is on {tensor.device} but {what}'s weights are on {parameter.device}; "
                             f"move one to the other ({name}.to({str(parameter.device)!r}) or "
                             f"model.to({str(tensor.device)!r}))")
        if (dtype and tensor.is_floating_point() and tensor.dtype != parameter.dtype
                and not torch.is_autocast_enabled(tensor.device.type)):
            short_input, short_weights = str(tensor.dtype).removeprefix("torch."), str(parameter.dtype).removeprefix(
                "torch.")
            raise ValueError(f"{name} is {short_input} but {what}'s weights are {short_weights}; convert one to "
                             f"the other ({name}.to(torch.{short_weights}) or model.to(torch.{short_input}))")


def env_choice(variable: str, choices: Sequence[str], default: str, hint: str = "") -> str:
    """The environment variable ``variable`` as one of ``choices``: stripped and lowercased,
    ``default`` when unset or blank.

    Raises:
        ValueError: one line naming the variable, what it holds, the choices and ``hint``.
    """
    raw = os.environ.get(variable, "")
    value = raw.strip().lower() or default
    if value not in choices:
        raise ValueError(f"{variable}={raw!r} is not one of {', '.join(choices)}" + (f"; {hint}" if hint else ""))
    return value
