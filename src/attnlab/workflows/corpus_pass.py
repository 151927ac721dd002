"""A corpus pass shared between processes and safe to stop: shards, exact merges, checkpoints.

``torchrun --nproc_per_node N -m attnlab.cli analyze ...`` starts N processes; each takes
every N-th batch (its shard), keeps float64 sums and counts (never means), and at the end
the processes exchange their sums, which add to exactly what one process would have
(:func:`~attnlab.inspect.compute.site_statistics.add_states`). Only process 0 writes files.

Every process writes its partial sums to ``OUT/.analysis-partial/rank{r}-of-{N}.pt`` every
``checkpoint_seconds`` (atomically: a temporary file, then a rename), and at once when SIGINT
or SIGTERM arrives, after the batch in hand; then it stops with :class:`AnalysisInterrupted`.
The same command run again reads the checkpoint, skips the batches it holds and ends with
the result an uninterrupted run gives, byte for byte. A killed process (SIGKILL) loses only
what came after its last checkpoint. A checkpoint of other data, settings, model or number of
processes is refused in one line rather than mixed in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from ..inspect.compute.site_statistics import add_states
from ..train.distributed import DistributedInfo, distributed_info
from ..train.interrupts import InterruptGuard

__all__ = ["AnalysisInterrupted", "CorpusPass", "PARTIAL_DIR", "fingerprint"]

PARTIAL_DIR = ".analysis-partial"


class AnalysisInterrupted(Exception):
    """A pass stopped on a signal after writing its checkpoint.

    Attributes:
        checkpoint: the file written; exit_code: ``128 + signal number``.
    """

    def __init__(self, signal_number: int, checkpoint: Path, examples: int) -> None:
        self.checkpoint, self.exit_code = checkpoint, 128 + int(signal_number)
        super().__init__(f"stopped by {signal.Signals(signal_number).name} after {examples} examples; partial "
                         f"statistics written to {checkpoint}: run the same command again to resume")


def fingerprint(**parts: Any) -> str:
    """A digest of what a pass depends on (data, settings, model, number of processes)."""
    text = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CorpusPass:
    """The passes of one analysis over a corpus, sharded and checkpointed.

    Args:
        out: the output directory (``None``: no checkpoints).
        key: :func:`fingerprint` of the data, settings and model (``None`` without ``out``).
        checkpoint_seconds: the most time between two checkpoints (0: after every batch).
        info: this process's rank and the number of processes (default: torch.distributed's).
    """

    def __init__(self, out: Optional[Path], key: Optional[str], *, checkpoint_seconds: float = 60.0,
                 info: Optional[DistributedInfo] = None) -> None:
        if not checkpoint_seconds >= 0:  # also refuses nan
            raise ValueError(f"checkpoint_seconds must be 0 or more, got {checkpoint_seconds}")
        self.info = info or distributed_info()
        self.key, self.every = key, checkpoint_seconds
        self.path = None if out is None else (
            Path(out) / PARTIAL_DIR / f"rank{self.info.rank}-of-{self.info.world_size}.pt")
        self.saved: dict[str, Any] = self._load()
        self._last = time.monotonic()

    def _load(self) -> dict[str, Any]:
        if self.path is None or not self.path.exists():
            others = [] if self.path is None or not self.path.parent.is_dir() else sorted(
                path.name for path in self.path.parent.glob("rank*-of-*.pt"))
            if others:
                raise ValueError(
                    f"{self.path.parent} holds a partial analysis run with another number of processes ({others[0]}); "
                    f"resume it with that number, or remove {self.path.parent} to start afresh")
            return {}
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as error:  # a file cut short by a kill between write and rename cannot be: still, say so
            raise ValueError(f"{self.path} cannot be read ({type(error).__name__}); remove {self.path.parent} to "
                             f"start afresh") from None
        if saved.get("key") != self.key:
            raise ValueError(
                f"{self.path.parent} holds a partial analysis of other data, settings or model; run the command "
                f"that started it to resume, or remove {self.path.parent} (or choose another --out) to start afresh")
        return saved

    def save(self, name: str, part: dict[str, Any]) -> Optional[Path]:
        """Keep ``part`` as this process's state of pass ``name`` on disk (atomically)."""
        self.saved[name] = part
        if self.path is None:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        torch.save({"key": self.key, **self.saved}, temporary)
        os.replace(temporary, self.path)
        self._last = time.monotonic()
        return self.path

    def run(self, name: str, batches: Iterable[Any],
            step: Callable[[Iterable[Any], Optional[dict], Callable], dict[str, Any]],
            *, progress: Optional[Callable[[int], None]] = None) -> dict[str, Any]:
        """This process's state of pass ``name``: ``step(own_batches, state, after_batch)`` runs
        the batches of this process's shard that no checkpoint holds yet, from ``state``, and
        calls ``after_batch(state_so_far, examples)`` after each. Done passes come back from
        the checkpoint as they are."""
        saved = self.saved.get(name)
        if saved is not None and saved["done"]:
            return saved["state"]
        start = 0 if saved is None else int(saved["next"])
        position = {"next": start}
        rank, world = self.info.rank, self.info.world_size

        def own() -> Iterator[Any]:
            for index, batch in enumerate(batches):
                if index >= start and index % world == rank:
                    position["next"] = index + 1
                    yield batch

        with InterruptGuard() as guard:
            def after_batch(so_far: Callable[[], dict[str, Any]], examples: int) -> None:
                if progress is not None:
                    progress(examples)
                if guard.received is not None or (self.path is not None
                                                   and time.monotonic() - self._last >= self.every):
                    state = so_far()
                    written = self.save(name, {"state": state, "next": position["next"], "done": False})
                    if guard.received is not None:
                        if written is None:
                            raise KeyboardInterrupt(signal.Signals(guard.received).name)
                        raise AnalysisInterrupted(guard.received, written, int(state.get("examples", 0)))

            state = step(own(), None if saved is None else saved["state"], after_batch)
        self.save(name, {"state": state, "next": position["next"], "done": True})
        return state

    def merged(self, state: Any) -> Any:
        """Every process's ``state`` added, in rank order (``state`` itself in one process)."""
        if self.info.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return state
        gathered: list[Any] = [None] * self.info.world_size
        dist.all_gather_object(gathered, state)
        total = None
        for part in gathered:
            total = add_states(total, part)
        return total

    def finish(self) -> None:
        """The result is written: the checkpoints go (process 0 removes the folder once all are done)."""
        if self.path is None:
            return
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.info.is_main:
            shutil.rmtree(self.path.parent, ignore_errors=True)
