"""A GGUF file's architecture, read from its header without parsing the whole file.

``gguf.GGUFReader`` parses every metadata field, the tokenizer's lists included: 20 s for
Gemma 3's 262,144 tokens. Which door opens a file (attnlab's own Llama-family decoder, or
transformers' GGUF reader for the others) needs only ``general.architecture``, which
llama.cpp's writers put first; the key-value pairs before it are skipped by their sizes.

The header (little-endian): ``b"GGUF"``, version ``uint32``, tensor count ``uint64``,
key-value count ``uint64``, then each pair: key (``uint64`` length + UTF-8), value type
``uint32``, value. Strings are a ``uint64`` length and bytes; arrays an element type
``uint32``, a ``uint64`` count and the elements.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Union

from ..errors import UnsupportedCheckpointError

__all__ = ["gguf_architecture"]

# value type -> size in bytes of the fixed-size types (GGUF's GGUFValueType)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _read(stream: BinaryIO, size: int, where: str) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise UnsupportedCheckpointError(f"{where}: the GGUF header ends early; the file is cut short or damaged")
    return data


def _string(stream: BinaryIO, where: str) -> str:
    (length,) = struct.unpack("<Q", _read(stream, 8, where))
    return _read(stream, length, where).decode("utf-8", errors="replace")


def _skip(stream: BinaryIO, kind: int, where: str) -> None:
    if kind in _FIXED:
        stream.seek(_FIXED[kind], 1)
    elif kind == _STRING:
        (length,) = struct.unpack("<Q", _read(stream, 8, where))
        stream.seek(length, 1)
    elif kind == _ARRAY:
        element, count = struct.unpack("<IQ", _read(stream, 12, where))
        if element in _FIXED:
            stream.seek(_FIXED[element] * count, 1)
        else:
            for _ in range(count):
                _skip(stream, element, where)
    else:
        raise UnsupportedCheckpointError(f"{where}: unknown GGUF value type {kind}; the file is damaged")


def gguf_architecture(path: Union[str, Path]) -> str:
    """``general.architecture`` of the GGUF file at ``path`` (``"llama"``, ``"gemma3"``, ...).

    Raises:
        UnsupportedCheckpointError: not a GGUF file, a damaged header, or no architecture.
    """
    where = str(path)
    with open(path, "rb") as stream:
        if _read(stream, 4, where) != b"GGUF":
            raise UnsupportedCheckpointError(f"{where} is not a GGUF file (it does not begin with 'GGUF')")
        _version, _tensors, pairs = struct.unpack("<IQQ", _read(stream, 20, where))
        for _ in range(pairs):
            key = _string(stream, where)
            (kind,) = struct.unpack("<I", _read(stream, 4, where))
            if key == "general.architecture" and kind == _STRING:
                return _string(stream, where)
            _skip(stream, kind, where)
    raise UnsupportedCheckpointError(f"{where}: the GGUF metadata names no general.architecture")
