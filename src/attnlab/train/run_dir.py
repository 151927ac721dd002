"""Which directories ``attnlab train`` and ``attnlab demo`` may write into, and what they may remove.

A run directory holds only what attnlab writes there (:data:`RUN_ENTRIES`). The rules:

* a new or empty ``--out`` is used as it is;
* ``--resume`` needs a run directory;
* a run that never got going (its ``config.json`` and perhaps its tokenizer, but no
  checkpoint, metrics or report: a start that failed) is replaced by the next start, so a
  corrected command just works;
* anything else that is not empty is refused, with a message naming ``--overwrite``;
* ``--overwrite`` removes attnlab's own entries only: files attnlab did not write are never
  removed, whatever the flags.

``attnlab demo`` marks its run with :data:`DEMO_MARK` and replaces an earlier demo run
without a flag (``make demo`` twice works); a ``train`` run is another matter and needs
``--overwrite``.

A run directory in use is locked (:func:`hold_run_dir`: an advisory ``flock`` on the
directory itself, so nothing is written to take it): a second run into it, resumed or
overwriting, is refused in one line naming the first's process, before it touches a file.
The lock goes with the process that holds it, however that process ends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from .._files import check_output_dir

__all__ = ["DEMO_MARK", "RUN_ENTRIES", "check_out_dir", "clear_run_entries", "hold_run_dir", "is_run_dir",
           "release_run_dir"]

DEMO_MARK = ".attnlab-demo"
RUN_ENTRIES = (
    "config.json", "tokenizer.json", "metrics.jsonl", "test_report.json", "checkpoints", "pretrain",
    "tensorboard", "inspect", "attention.png", DEMO_MARK,
)
_STARTED = ("checkpoints", "metrics.jsonl", "test_report.json", "pretrain")


_HELD: dict[tuple[int, int], int] = {}  # (device, inode) of a directory this process holds -> its descriptor


def _holder(path: Path) -> Optional[int]:
    """The process that holds a ``flock`` on ``path``, from ``/proc/locks`` (Linux), else ``None``."""
    stat = path.stat()
    identity = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].lower() == identity:
            return int(fields[4])
    return None


def hold_run_dir(path: Path, command: str = "train") -> None:
    """Lock the run directory ``path`` for this process (it must exist); again is a no-op.

    Raises:
        ValueError: another process holds it; the message names that process.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock to take
        return
    stat = path.stat()
    key = (stat.st_dev, stat.st_ino)
    if key in _HELD:
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        holder = _holder(path)
        raise ValueError(
            f"{path} is in use by another attnlab run ({f'process {holder}' if holder else 'another process'}); "
            f"wait for it to end, or choose another --out for this {command}"
        ) from None
    _HELD[key] = descriptor


def release_run_dir(path: Path) -> None:
    """Release :func:`hold_run_dir`'s lock on ``path`` (a no-op if this process does not hold it)."""
    try:
        stat = path.stat()
    except OSError:
        return
    descriptor = _HELD.pop((stat.st_dev, stat.st_ino), None)
    if descriptor is not None:
        os.close(descriptor)  # closing the last descriptor releases the flock


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds an attnlab run (its ``config.json`` has the run's tables)."""
    import json

    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(values, dict) and {"model", "data", "train"} <= set(values)


def _foreign(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.iterdir() if entry.name not in RUN_ENTRIES)


def clear_run_entries(path: Path) -> list[str]:
    """Remove attnlab's own entries from ``path``; returns the names of the others, kept."""
    for name in RUN_ENTRIES:
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()
    for entry in path.glob("checkpoints.*"):  # a save cut short leaves a temporary sibling
        shutil.rmtree(entry, ignore_errors=True)
    return _foreign(path)


def check_out_dir(
    out: Path, *, resume: bool = False, overwrite: bool = False, demo: bool = False, command: str = "train"
) -> Optional[str]:
    """Check ``--out`` before anything is written, and clear what the flags allow.

    Returns:
        ``None``, or a one-line notice for the user (entries replaced or kept).

    Raises:
        ValueError: ``out`` is a file, cannot be written, or holds something the flags do not allow replacing;
            the message says which flag or directory to use.
        FileNotFoundError: ``--resume`` on a directory that holds no run.
    """
    out = check_output_dir(out, "--out", "the run")
    if out.is_dir():
        hold_run_dir(out, command)  # before anything in it is read as finished or cleared
    try:
        return _check_held_out_dir(out, resume, overwrite, demo, command)
    except BaseException:
        release_run_dir(out)  # refused: the folder is free for the corrected command
        raise


def _check_held_out_dir(out: Path, resume: bool, overwrite: bool, demo: bool, command: str) -> Optional[str]:
    if resume:
        if not is_run_dir(out):
            raise FileNotFoundError(f"cannot resume: {out} holds no attnlab run (no run config.json); "
                                    f"start one with attnlab {command} --out {out}")
        return None
    if not out.exists() or not any(out.iterdir()):
        return None
    foreign = _foreign(out)
    run = is_run_dir(out)
    own_demo = demo and (out / DEMO_MARK).is_file() and not foreign
    unstarted = run and not any((out / name).exists() for name in _STARTED)
    if overwrite or own_demo or (unstarted and not foreign):
        kept = clear_run_entries(out)
        if kept:
            return f"replaced attnlab's files in {out}; kept yours: {', '.join(kept[:5])}"
        return f"replaced the earlier run in {out}" if run and not unstarted else None
    if run:
        resume_hint = "" if demo else "--resume to continue it, "
        raise ValueError(
            f"{out} already holds a run; pass {resume_hint}--overwrite to replace it "
            f"(files attnlab did not write are kept), or choose another --out"
        )
    held = foreign or sorted(entry.name for entry in out.iterdir())
    raise ValueError(
        f"{out} is not empty and is not an attnlab run (it holds {', '.join(held[:3])}"
        f"{', ...' if len(held) > 3 else ''}); choose a new or empty --out, or pass --overwrite to "
        f"write the run beside those files (they are never removed)"
    )
