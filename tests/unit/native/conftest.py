"""What the native kernels' tests share: a script run in a fresh interpreter, where an
environment variable (ATEN_CPU_CAPABILITY, ATTNLAB_NATIVE) takes effect from the start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def run_python():
    """``run_python(script, **variables)``: runs ``script`` (dedented) in a fresh interpreter
    with ``variables`` added to the environment; asserts it succeeds and returns its stdout."""

    def run(script: str, **variables: str) -> str:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                              env={**os.environ, **variables}, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    return run
