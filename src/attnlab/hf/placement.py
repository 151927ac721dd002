"""Where a transformers model's layers live: accelerate's device maps, memory budgets, disk offload.

A model larger than one device opens with ``device_map`` (``"auto"``, ``"balanced"``,
``"balanced_low_0"``, ``"sequential"`` or ``{module name: device}``): accelerate gives each
device at most its ``max_memory`` budget (``{0: "20GiB", "cpu": "30GiB"}``), in the order
GPUs, CPU, disk, and puts what is left on disk, in ``offload_dir``. Offloaded layers sit on
the meta device and are brought in by accelerate's hooks for their own forward, so
attnlab's attention function serves every layer where it runs.

:func:`placement` checks all of it before anything is read (sizes parsed, the offload
folder empty or new and writable, accelerate installed) and gives a :class:`Placement`;
:meth:`Placement.from_pretrained_options` is what ``from_pretrained`` takes, and
:meth:`Placement.check_dispatched` refuses a map that put layers on disk when no offload
folder was given. Messages name the arguments as the caller has them: the library's
(``max_memory``) or the command line's (``--max-memory``, :data:`COMMAND_LINE`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

import torch
from torch import nn

if TYPE_CHECKING:
    from ..checkpoints.source import Source

__all__ = ["COMMAND_LINE", "DEVICE_MAPS", "LIBRARY", "Placement", "describe_map", "is_dispatched", "parse_max_memory",
           "parse_size", "placement", "refuse_unplaceable"]

# The device maps accelerate computes itself (a dict names each module's device instead).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
# What each argument is called where the caller gave it.
LIBRARY = {"device_map": "device_map", "max_memory": "max_memory", "offload_dir": "offload_dir", "device": "device"}
COMMAND_LINE = {"device_map": "--device-map", "max_memory": "--max-memory", "offload_dir": "--offload-dir",
                "device": "--device"}

# Decimal units as accelerate reads them (1GB = 10^9 bytes), binary ones as 2^10 steps.
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")
_NAMED_DEVICES = ("cpu", "mps", "disk")

MemoryKey = Union[int, str]


@dataclass(frozen=True)
class Placement:
    """A checked device map, memory budgets and offload folder, for ``from_pretrained``.

    Attributes:
        device_map: one of :data:`DEVICE_MAPS`, or ``{module name: device}``.
        max_memory: bytes per device (GPU indices, ``"cpu"``, ``"mps"``, ``"disk"``), or
            ``None``: what each device has free.
        offload_dir: the folder for offloaded weights (empty or new when checked), or ``None``.
        names: the arguments' names in messages (:data:`LIBRARY` or :data:`COMMAND_LINE`).
    """

    device_map: Union[str, dict[str, Any]]
    max_memory: Optional[dict[MemoryKey, int]] = None
    offload_dir: Optional[Path] = None
    names: Mapping[str, str] = field(default_factory=lambda: dict(LIBRARY))

    def from_pretrained_options(self) -> dict[str, Any]:
        """``from_pretrained``'s keywords; the offload folder is made here, when it is about to be used."""
        options: dict[str, Any] = {"device_map": self.device_map}
        if self.max_memory is not None:
            options["max_memory"] = dict(self.max_memory)
        if self.offload_dir is not None:
            self.offload_dir.mkdir(parents=True, exist_ok=True)
            options["offload_folder"] = str(self.offload_dir)
        return options

    def within(self, name: str) -> "Placement":
        """The same placement with the offloaded weights in ``offload_dir / name`` (one folder
        per model, when several are opened with one offload folder)."""
        return self if self.offload_dir is None else replace(self, offload_dir=self.offload_dir / name)

    def check_dispatched(self, model: nn.Module) -> None:
        """Refuse a model whose map put modules on disk when no offload folder was given.

        transformers can read offloaded safetensors weights in place, but an offload that
        nobody asked for would make every forward read the disk: the budget says so, in one line.
        """
        device_map = getattr(model, "hf_device_map", None) or {}
        on_disk = [name for name, where in device_map.items() if where == "disk"]
        if on_disk and self.offload_dir is None:
            names = self.names
            more = f" and {len(on_disk) - 1} more" if len(on_disk) > 1 else ""
            first = on_disk[0] or "the whole model"  # "": the map placed the model as one piece
            raise ValueError(f"{names['max_memory']} leaves no room for {first}{more} but on disk: pass "
                             f"{names['offload_dir']} (an empty or new folder) to offload them there, or give a "
                             f"larger {names['max_memory']}")


def placement(device_map: Union[None, str, Mapping[str, Any]] = None,
              max_memory: Union[None, str, Mapping[Any, Any]] = None,
              offload_dir: Union[None, str, Path] = None, *, device: Any = None,
              names: Mapping[str, str] = LIBRARY) -> Optional[Placement]:
    """The placement these arguments ask for, checked; ``None`` when none is given.

    ``max_memory`` or ``offload_dir`` alone mean ``device_map="auto"``.

    Args:
        device_map: one of :data:`DEVICE_MAPS` or ``{module name: device}``.
        max_memory: ``{device: size}`` (sizes in bytes or as ``"300MB"``, ``"2GiB"``) or
            ``"cpu=300MB,0=20GiB"`` (:func:`parse_max_memory`).
        offload_dir: a folder for offloaded weights: new, or empty, and writable.
        device: the caller's one device, refused beside a device map.
        names: the arguments' names in messages.

    Raises:
        ValueError: a bad value (named), ``device`` beside a device map, an offload folder
            that holds files or cannot be written.
        ImportError: accelerate is not installed (the message names the extra).
    """
    if device_map is None and max_memory is None and offload_dir is None:
        return None
    if device is not None:
        raise ValueError(f"{names['device']} puts the whole model on one device and {names['device_map']} spreads "
                         f"it over several: give one of them")
    device_map = "auto" if device_map is None else device_map
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAPS:
            raise ValueError(f"{names['device_map']} must be one of {', '.join(DEVICE_MAPS)} or a dict "
                             f"{{module name: device}}, got {device_map!r}")
    elif isinstance(device_map, Mapping) and device_map and all(isinstance(key, str) for key in device_map):
        device_map = dict(device_map)
    else:
        raise ValueError(f"{names['device_map']} must be one of {', '.join(DEVICE_MAPS)} or a dict "
                         f"{{module name: device}}, got {device_map!r}")
    budgets = None if max_memory is None else parse_max_memory(max_memory, argument=names["max_memory"])
    folder = None if offload_dir is None else _check_offload_dir(offload_dir, names["offload_dir"])
    if isinstance(device_map, dict) and "disk" in device_map.values() and folder is None:
        raise ValueError(f"{names['device_map']} puts modules on disk: pass {names['offload_dir']} (an empty or "
                         f"new folder) for their weights")
    try:
        import accelerate  # noqa: F401  (transformers dispatches through it)
    except ImportError:
        raise ImportError(f"{names['device_map']}, {names['max_memory']} and {names['offload_dir']} need "
                          f"accelerate: pip install 'attnlab[big]'") from None
    return Placement(device_map, budgets, folder, dict(names))


def parse_size(value: Any, *, argument: str = "size") -> int:
    """Bytes from ``value``: a whole number of bytes, or a string such as ``"300MB"``,
    ``"1.5GB"`` (powers of 10), ``"2GiB"``, ``"512MiB"`` (powers of 2), ``"4096"``.

    Raises:
        ValueError: anything else, named by ``argument``.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"{argument}: {value!r} is not a size; give bytes or a number with a unit "
                         f"(300MB, 1.5GB, 2GiB, 512MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def parse_max_memory(value: Union[str, Mapping[Any, Any]], *, argument: str = "max_memory") -> dict[MemoryKey, int]:
    """``{device: bytes}`` from ``{"cpu": "300MB", 0: "20GiB"}`` or ``"cpu=300MB,0=20GiB"``.

    Devices: ``"cpu"``, ``"mps"``, ``"disk"``, or a GPU by its index (``0``, ``"0"`` or
    ``"cuda:0"``); a GPU this machine does not have is refused.

    Raises:
        ValueError: a bad device or size, named with the value that came in.
    """
    if isinstance(value, str):
        pairs = []
        for part in filter(None, (piece.strip() for piece in value.split(","))):
            device, equals, size = part.partition("=")
            if not equals:
                raise ValueError(f"{argument}: {part!r} is not DEVICE=SIZE; give e.g. cpu=300MB,0=20GiB")
            pairs.append((device.strip(), size.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ValueError(f"{argument} must be a dict {{device: size}} or 'cpu=300MB,0=20GiB', got {value!r}")
    if not pairs:
        raise ValueError(f"{argument} names no device; give e.g. cpu=300MB,0=20GiB")
    budgets: dict[MemoryKey, int] = {}
    for device, size in pairs:
        key = _memory_key(device, argument)
        budgets[key] = parse_size(size, argument=f"{argument} for {key!r}")
    return budgets


def _memory_key(device: Any, argument: str) -> MemoryKey:
    """A ``max_memory`` key as accelerate takes it: a GPU index, or a named device."""
    text = str(device).strip().lower() if isinstance(device, (str, int)) and not isinstance(device, bool) else None
    if text in _NAMED_DEVICES:
        return text
    index = text.removeprefix("cuda:") if text is not None else None
    if index is None or not index.isdigit():
        raise ValueError(f"{argument}: {device!r} is not a device; give cpu, disk, mps or a GPU's index (0, 1, ...)")
    gpus = torch.cuda.device_count()
    if int(index) >= gpus:
        seen = "no GPU" if gpus == 0 else f"GPUs 0..{gpus - 1}"
        raise ValueError(f"{argument}: GPU {int(index)} is not on this machine (torch sees {seen}); give budgets "
                         f"for the devices it has")
    return int(index)


def _check_offload_dir(path: Union[str, Path], argument: str) -> Path:
    """``path`` as an offload folder: new (where it can be made) or empty, and writable
    (:func:`~attnlab._files.check_output_dir`, which leaves nothing behind). A user's files
    are never written over: a folder that holds any is refused."""
    from .._files import check_output_dir

    folder = check_output_dir(Path(path).expanduser(), argument, "the offloaded weights")
    held = sorted(child.name for child in folder.iterdir()) if folder.is_dir() else []
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ValueError(f"{argument} {folder} is not empty ({shown}); attnlab writes offloaded weights there "
                         f"and never over files it did not make: give an empty or new folder")
    return folder


def refuse_unplaceable(source: "Source", names: Mapping[str, str] = LIBRARY) -> None:
    """One line for a model that a device map cannot place: attnlab's own formats and GGUF
    files open whole, in attnlab's own classes (only HuggingFace directories go through
    transformers and accelerate)."""
    if source.gguf is not None:
        what = f"{source.where} is a GGUF file"
    elif source.is_attnlab:
        what = f"{source.where} is an attnlab {'run' if source.format == 'attnlab-run' else 'checkpoint'}"
    else:
        return
    raise ValueError(f"{names['device_map']}, {names['max_memory']} and {names['offload_dir']} place a HuggingFace "
                     f"directory's layers through transformers; {what}, which attnlab opens whole: leave them out "
                     f"(or save it as a HuggingFace directory first)")


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate placed ``model``'s modules (a device map)."""
    return bool(getattr(model, "hf_device_map", None))


def describe_map(model: nn.Module) -> str:
    """``"2 modules on cpu, 6 on disk"``: where a dispatched model's modules went, for one line."""
    counts: dict[str, int] = {}
    for where in (getattr(model, "hf_device_map", None) or {}).values():
        counts[str(where)] = counts.get(str(where), 0) + 1
    parts = [f"{count} {'module' if count == 1 else 'modules'} on {where}" if index == 0 else f"{count} on {where}"
             for index, (where, count) in enumerate(counts.items())]
    return ", ".join(parts) or "no device map"
