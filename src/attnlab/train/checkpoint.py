"""Checkpoint directories, written atomically.

A checkpoint is a directory with ``model.safetensors`` + ``config.json`` (the model,
no pickle), ``trainer_state.pt`` (step, optimizer, scheduler, RNG states, data
position; only tensors and plain containers, read with ``torch.load(weights_only=True)``)
and optionally ``tokenizer.json``. It is written into a temporary sibling directory
and renamed into place, so a crash mid-save leaves the previous checkpoint whole.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch
from torch import nn

from ..models.serialization import MODEL_FILE, save_model

__all__ = ["TRAINER_STATE_FILE", "save_checkpoint", "load_trainer_state", "rng_state", "set_rng_state", "atomic_directory"]

logger = logging.getLogger(__name__)
TRAINER_STATE_FILE = "trainer_state.pt"
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


class atomic_directory:
    """Context manager: yields a temporary directory that replaces ``target`` on success.

    On an exception the temporary directory is removed and ``target`` is untouched.
    The swap is two renames; if the process dies between them the previous version
    stays as ``<target>.old`` and :func:`recover_directory` puts it back.
    """

    def __init__(self, target: Union[str, Path]) -> None:
        self.target = Path(target)

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        recover_directory(self.target)
        self.temporary = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.tmp-", dir=self.target.parent))
        return self.temporary

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if exc_type is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)
            return False
        old = self.target.with_name(self.target.name + _OLD_SUFFIX)
        if self.target.exists():
            os.replace(self.target, old)
        os.replace(self.temporary, self.target)
        shutil.rmtree(old, ignore_errors=True)
        _fsync_directory(self.target.parent)
        return False


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
) -> Path:
    """Write a checkpoint directory atomically (see the module docstring)."""
    directory = Path(directory)
    with atomic_directory(directory) as temporary:
        save_model(model, temporary, tokenizer=tokenizer)
        if trainer_state is not None:
            with open(temporary / TRAINER_STATE_FILE, "wb") as handle:
                torch.save(trainer_state, handle)
                handle.flush()
                os.fsync(handle.fileno())
    return directory


def load_trainer_state(directory: Union[str, Path]) -> dict[str, Any]:
    """The trainer state of a checkpoint, read with ``torch.load(weights_only=True)``."""
    directory = Path(directory)
    recover_directory(directory)
    path = directory / TRAINER_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {TRAINER_STATE_FILE}; it cannot be resumed from")
    if not (directory / MODEL_FILE).is_file():
        raise FileNotFoundError(f"{directory} has no {MODEL_FILE}")
    return torch.load(path, map_location="cpu", weights_only=True)
