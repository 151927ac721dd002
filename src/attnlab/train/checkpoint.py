"""Checkpoint directories, written atomically, kept in rotation and checked on load.

A checkpoint is a directory with ``model.safetensors`` + ``config.json`` (the model,
no pickle), ``trainer_state.pt`` (step, optimizer, scheduler, RNG states, data
position; only tensors and plain containers, read with ``torch.load(weights_only=True)``),
optionally ``tokenizer.json``, and ``checkpoint.json`` (the step and every file's size,
written last). It is written into a temporary sibling directory, every file is flushed
to disk, and the directory is renamed into place, so a crash mid-save leaves the previous
checkpoint whole. Files and folders follow the umask like every other file.

Resumable checkpoints rotate: with ``keep=3`` the newest is ``last``, the two before it
``last.1`` and ``last.2``. :func:`find_resumable` checks each (sizes, safetensors
header, ``config.json``, ``trainer_state.pt``) and picks the newest whole one, with a
warning when a newer one is damaged.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import secrets
import shutil
import zipfile
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np
import torch
from torch import nn

from .._files import CorruptFileError, check_safetensors, read_json, write_json
from ..checkpoints.attnlab_layout import CONFIG_FILE, MODEL_FILE, save_model

__all__ = [
    "TRAINER_STATE_FILE", "MANIFEST_FILE", "Resumable", "save_checkpoint", "load_trainer_state",
    "check_checkpoint", "find_resumable", "rotated_versions", "rng_state", "set_rng_state",
    "atomic_directory",
]

logger = logging.getLogger(__name__)
TRAINER_STATE_FILE = "trainer_state.pt"
MANIFEST_FILE = "checkpoint.json"
_OLD_SUFFIX = ".old"


def rng_state() -> dict[str, Any]:
    """Every global RNG state (Python, NumPy, torch CPU, CUDA) as tensors and plain values."""
    version, numpy_keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": version,
            "keys": torch.from_numpy(numpy_keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    version, keys, internal = state["python"]
    random.setstate((version, tuple(keys), internal))
    numpy_state = state["numpy"]
    np.random.set_state((
        numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["position"],
        numpy_state["has_gauss"], numpy_state["cached_gaussian"],
    ))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])



def rotated_versions(target: Union[str, Path], keep: int) -> list[Path]:
    """``[target, target.1, ..., target.<keep-1>]``: newest first."""
    target = Path(target)
    return [target] + [target.with_name(f"{target.name}.{index}") for index in range(1, keep)]


def _make_temporary_directory(target: Path) -> Path:
    # Not tempfile.mkdtemp: that makes 0700 folders, and a checkpoint should follow the
    # umask like every other file of the run.
    for _ in range(100):
        candidate = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"cannot create a temporary directory next to {target}")


def _replace_directory(source: Path, destination: Path) -> None:
    if destination.exists():
        shutil.rmtree(destination)
    os.replace(source, destination)


class atomic_directory:
    """Context manager: yields a temporary directory that replaces ``target`` on success.

    On an exception the temporary directory is removed and ``target`` is untouched.
    With ``keep=1`` the swap is two renames; if the process dies between them the
    previous version stays as ``<target>.old`` and :func:`recover_directory` puts it
    back. With ``keep > 1`` the previous versions move to ``<target>.1``,
    ``<target>.2``... (the oldest is dropped) before the new one is renamed into place;
    a crash in between leaves a gap that :func:`find_resumable` steps over.

    Args:
        target: the directory to write.
        keep: how many versions to keep, the new one included.
    """

    def __init__(self, target: Union[str, Path], *, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.target = Path(target)
        self.keep = keep

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        recover_directory(self.target)
        self.temporary = _make_temporary_directory(self.target)
        return self.temporary

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
            return False
        _fsync_files(self.temporary)
        if self.keep == 1:
            old = self.target.with_name(self.target.name + _OLD_SUFFIX)
            if self.target.exists():
                os.replace(self.target, old)
            os.replace(self.temporary, self.target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            versions = rotated_versions(self.target, self.keep)
            shutil.rmtree(versions[-1], ignore_errors=True)
            for newer, older in reversed(list(zip(versions[:-1], versions[1:]))):
                if newer.exists():
                    _replace_directory(newer, older)
            os.replace(self.temporary, self.target)
        _fsync_directory(self.target.parent)
        return False


def _fsync_files(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def recover_directory(target: Union[str, Path]) -> None:
    """Undo a swap interrupted between its two renames; drop stale temporary directories."""
    target = Path(target)
    old = target.with_name(target.name + _OLD_SUFFIX)
    if old.exists():
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            logger.warning("restoring %s from an interrupted save", target)
            os.replace(old, target)
    if target.parent.is_dir():
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)


def save_checkpoint(
    directory: Union[str, Path],
    model: nn.Module,
    trainer_state: Optional[dict[str, Any]] = None,
    *,
    tokenizer: Any = None,
    keep: int = 1,
) -> Path:
    """Write a checkpoint directory atomically (see the module docstring).

    Args:
        directory: where the checkpoint goes, e.g. ``run/checkpoints/last``.
        model: the model whose weights and architecture are saved.
        trainer_state: what :meth:`TransformerTrainer.trainer_state_dict` returns.
        tokenizer: saved as ``tokenizer.json`` when given.
        keep: versions of ``directory`` to keep (``last``, ``last.1``...), this one included.
    """
    directory = Path(directory)
    with atomic_directory(directory, keep=keep) as temporary:
        save_model(model, temporary, tokenizer=tokenizer)
        if trainer_state is not None:
            with open(temporary / TRAINER_STATE_FILE, "wb") as handle:
                torch.save(trainer_state, handle)
        trainer = trainer_state.get("trainer") if isinstance(trainer_state, dict) else None
        files = {path.name: path.stat().st_size for path in sorted(temporary.iterdir()) if path.is_file()}
        # written last: the sizes let a reader tell a whole checkpoint from a damaged one;
        # "trainer" (step, best metric...) can be read without unpickling anything
        write_json(temporary / MANIFEST_FILE, {"trainer": trainer if isinstance(trainer, dict) else None,
                                               "files": files})
    return directory


def _read_trainer_state(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, OSError) as error:
        if isinstance(error, FileNotFoundError):
            raise
        problem = " ".join(str(error).split())[:200]
        raise CorruptFileError(path, f"damaged trainer state ({type(error).__name__}: {problem})") from None
    if not isinstance(state, dict):
        raise CorruptFileError(path, f"holds a {type(state).__name__}, not a trainer state dict")
    return state


def check_checkpoint(directory: Union[str, Path], *, trainer_state: bool = True) -> Optional[dict[str, Any]]:
    """Check every file of a checkpoint directory; return its trainer state.

    Checks the sizes in ``checkpoint.json`` (when present), the safetensors header
    against the file's size, that ``config.json`` is a JSON object, and that
    ``trainer_state.pt`` loads with ``weights_only=True``.

    Args:
        directory: the checkpoint directory.
        trainer_state: whether the trainer state must be there (and is loaded and returned).

    Raises:
        FileNotFoundError: the directory, or one of its files, does not exist.
        CorruptFileError: a file is truncated or damaged (the error names it).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint at {directory}: the directory does not exist")
    required = [MODEL_FILE, CONFIG_FILE] + ([TRAINER_STATE_FILE] if trainer_state else [])
    for name in required:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} has no {name}" + (
                "; it cannot be resumed from" if name == TRAINER_STATE_FILE else ""))
    manifest_path = directory / MANIFEST_FILE
    if manifest_path.is_file():
        manifest = read_json(manifest_path)
        sizes = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(sizes, dict):
            raise CorruptFileError(manifest_path, "has no 'files' table of sizes")
        for name, expected in sizes.items():
            path = directory / name
            if not path.is_file():
                raise CorruptFileError(path, "missing, though the checkpoint was written with it")
            actual = path.stat().st_size
            if actual != expected:
                raise CorruptFileError(path, f"{actual} bytes, but {expected} were written")
    check_safetensors(directory / MODEL_FILE)
    config = read_json(directory / CONFIG_FILE)
    if not isinstance(config, dict) or "model_type" not in config:
        raise CorruptFileError(directory / CONFIG_FILE, "not a model config (a JSON object with model_type)")
    if not trainer_state:
        return None
    return _read_trainer_state(directory / TRAINER_STATE_FILE)


def load_trainer_state(directory: Union[str, Path]) -> dict[str, Any]:
    """The trainer state of a checkpoint, read with ``torch.load(weights_only=True)``,
    after :func:`check_checkpoint` found every file whole."""
    directory = Path(directory)
    recover_directory(directory)
    return check_checkpoint(directory)


class Resumable(NamedTuple):
    """A checkpoint that :func:`find_resumable` found whole: its directory and trainer state."""

    directory: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["trainer"]["step"])


def find_resumable(path: Union[str, Path]) -> Resumable:
    """The newest whole checkpoint among ``path`` and its rotated versions (``path.1``...).

    A damaged newer version is skipped with a warning that names the file and the
    problem; the step in each trainer state decides which is newest.

    Raises:
        FileNotFoundError: neither ``path`` nor any rotated version exists.
        CorruptFileError: every version is damaged (the newest one's problem is named).
    """
    path = Path(path)
    base = re.sub(r"\.\d+$", "", path.name)
    recover_directory(path.with_name(base))
    pattern = re.compile(re.escape(base) + r"(\.(\d+))?$")
    candidates = []
    if path.parent.is_dir():
        for entry in path.parent.iterdir():
            match = pattern.fullmatch(entry.name)
            if match and entry.is_dir():
                candidates.append((int(match.group(2) or 0), entry))
    if not candidates:
        raise FileNotFoundError(f"no checkpoint at {path}: the directory does not exist")
    found, problems = [], []
    for _, candidate in sorted(candidates):
        try:
            state = check_checkpoint(candidate)
            trainer = state.get("trainer")
            if not isinstance(trainer, dict) or not isinstance(trainer.get("step"), int):
                raise CorruptFileError(candidate / TRAINER_STATE_FILE, "has no trainer step")
        except (CorruptFileError, FileNotFoundError) as error:
            problems.append((candidate, error))
            continue
        found.append(Resumable(candidate, state))
    if not found:
        newest_problem = problems[0][1]
        if len(problems) > 1:
            raise CorruptFileError(getattr(newest_problem, "path", path),
                                   f"{getattr(newest_problem, 'problem', newest_problem)}; and no earlier "
                                   f"checkpoint next to it is whole either")
        raise newest_problem
    best = max(found, key=lambda resumable: resumable.step)
    for candidate, error in problems:
        logger.warning("skipping the damaged checkpoint %s (%s); resuming from %s (step %d)",
                       candidate, error, best.directory, best.step)
    return best
