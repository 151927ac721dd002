"""What the benchmarks that measure in a fresh interpreter share (memory is only comparable
between processes that start alike)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_child(arguments: list[str], what: str) -> str:
    """``python ARGUMENTS`` with this checkout's attnlab first on the path; its last line of output.

    Raises:
        RuntimeError: the child failed (the message ends with its error output).
    """
    source = str(Path(__file__).resolve().parents[1] / "src")  # this checkout's attnlab
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]
