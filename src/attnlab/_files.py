"""Reading and writing the files of models and runs, with one-line errors.

Every JSON file attnlab writes is strict JSON: NaN and infinities become ``null``
(:func:`json_dumps`). Every ``config.json`` and ``model.safetensors`` attnlab reads goes
through :func:`read_json` / :func:`check_safetensors` / :func:`load_safetensors`, which turn
a damaged file into one :class:`CorruptFileError` naming the file and what is wrong,
instead of a ``JSONDecodeError`` or ``SafetensorError`` traceback.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

__all__ = [
    "CorruptFileError", "json_dumps", "write_json", "read_json", "check_safetensors", "load_safetensors",
    "load_safetensors_into", "follow_umask", "check_output_dir",
]


class CorruptFileError(ValueError):
    """A file attnlab wrote (or was given) cannot be read: truncated, garbage, wrong layout.

    Args:
        path: the file.
        problem: what is wrong, in a few words.
    """

    def __init__(self, path: Union[str, Path], problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def json_dumps(value: Any, *, indent: Optional[int] = None) -> str:
    """Strict JSON text of ``value``: NaN and infinities (at any depth) become ``null``."""
    return json.dumps(_finite(value), indent=indent, allow_nan=False)


def write_json(path: Union[str, Path], value: Any, *, indent: Optional[int] = 2) -> None:
    """Write ``value`` as strict JSON (see :func:`json_dumps`) with a final newline."""
    Path(path).write_text(json_dumps(value, indent=indent) + "\n", encoding="utf-8")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(path: Union[str, Path]) -> Any:
    """The content of a JSON file; a damaged file raises one :class:`CorruptFileError`.

    ``NaN`` and ``Infinity`` (Python's extensions to JSON) are refused as well.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptFileError(path, f"not UTF-8 text (byte {error.start})") from None
    if not text.strip():
        raise CorruptFileError(path, "the file is empty")
    try:
        return json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise CorruptFileError(path, f"not valid JSON ({error.msg} at {where})") from None
    except ValueError as error:
        raise CorruptFileError(path, f"not valid JSON ({error})") from None


def check_safetensors(path: Union[str, Path]) -> list[str]:
    """Check a safetensors file's header against its size without reading the tensors.

    Returns:
        The tensor names in the file.

    Raises:
        CorruptFileError: the file is truncated, has a damaged header, or is not safetensors.
    """
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return list(handle.keys())
    except SafetensorError as error:
        raise CorruptFileError(path, f"damaged safetensors file ({_message(error)})") from None


def load_safetensors(path: Union[str, Path], *, device: str = "cpu") -> dict[str, Any]:
    """All tensors of a safetensors file (``safetensors.torch.load_file`` with one-line errors)."""
    import safetensors.torch
    from safetensors import SafetensorError

    try:
        return safetensors.torch.load_file(str(path), device=device)
    except SafetensorError as error:
        raise CorruptFileError(path, f"damaged safetensors file ({_message(error)})") from None


def load_safetensors_into(model: Any, path: Union[str, Path], *, strict: bool = True,
                          device: str = "cpu") -> tuple[list[str], list[str]]:
    """``safetensors.torch.load_model`` with one-line errors; returns ``(missing, unexpected)``."""
    import safetensors.torch
    from safetensors import SafetensorError

    try:
        missing, unexpected = safetensors.torch.load_model(model, str(path), strict=strict, device=device)
    except SafetensorError as error:
        raise CorruptFileError(path, f"damaged safetensors file ({_message(error)})") from None
    except RuntimeError as error:  # strict loading: names or shapes differ from the model
        raise CorruptFileError(path, f"does not fit the model ({_message(error)})") from None
    return list(missing), list(unexpected)


def _message(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # the portable way to read it is to set it
    os.umask(mask)
    return mask


def follow_umask(path: Union[str, Path]) -> None:
    """Give a file the permissions ``open()`` would have (``0o666`` less the umask).

    ``safetensors`` writes its files through a private temporary file (mode ``0o600``);
    a model's weights should be as readable as the rest of its directory.
    """
    os.chmod(path, 0o666 & ~_umask())


def check_output_dir(path: Union[str, Path], option: str = "--out", contents: str = "the results") -> Path:
    """Check, before any work, that ``path`` can be made (or used) as an output directory.

    Nothing is left behind: the path is either a directory already, or its nearest existing
    ancestor is a directory this process may write into, which a directory made and removed
    there at once shows.

    Args:
        path: the output directory.
        option: how the user named it (``--out``, ``--report``), for the message.
        contents: what goes there, for the message.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: ``path`` is empty, is a file, lies under a file, or under a directory this
            process cannot write into; the message names the place and what to do.
    """
    if not str(path).strip():  # Path("") is the working directory: results would land among the user's files
        raise ValueError(f"{option} is empty; name a directory (new or existing) for {contents}")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file; name a directory (new or existing) for {contents}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{option} {path} lies under the file {existing}, so no directory can be made there; "
                         f"choose another {option}")
    where = "into it" if existing == path else f"into {existing}, where it would be made"
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: this user may not write {where}; choose another {option}")
    try:  # permissions are not the whole story (root, /proc, a read-only mount): try, and leave nothing
        os.rmdir(tempfile.mkdtemp(prefix=".attnlab-check-", dir=existing))
    except OSError as error:
        raise ValueError(f"{option} {path}: nothing can be written {where} ({error.strerror}); "
                         f"choose another {option}") from None
    return path


def check_output_file(path: Union[str, Path], option: str = "--out", contents: str = "the results") -> Path:
    """Check, before any work, that the file ``path`` can be written: not a directory, and its
    folder a directory that exists or can be made, where this process may write
    (:func:`check_output_dir`; nothing is left behind).

    Raises:
        ValueError: the message names the place and what to do.
    """
    if not str(path).strip():
        raise ValueError(f"{option} is empty; name the file for {contents}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; name the file for {contents}")
    if path.parent.exists() and not path.parent.is_dir():
        raise ValueError(f"{option} {path} lies under the file {path.parent}; choose another {option}")
    check_output_dir(path.parent, option, contents)
    return path


def check_path_argument(name: str, value: Any) -> None:
    """Refuse a ``value`` that is not a path (``None``, a number, an empty string) with one
    line naming ``name``, before pathlib's own ``TypeError`` about ``NoneType``."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)) or not str(os.fspath(value)).strip():
        raise TypeError(f"{name} must be a path or a packaged name (str or pathlib.Path), got {value!r}")


def nonempty_path(value: str) -> Path:
    """An argparse ``type`` for an output path: ``""`` is refused (``Path("")`` is the working
    directory, where results would land among the user's own files)."""
    import argparse

    if not value.strip():
        raise argparse.ArgumentTypeError("is empty; name a directory (new or existing)")
    return Path(value)
