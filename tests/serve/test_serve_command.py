"""``attnlab serve`` run for real: it stops cleanly on SIGTERM and Ctrl-C, needs a token beyond
the loopback, and refuses a port in use or a model it cannot open in one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

SOURCE = str(Path(__file__).resolve().parents[2] / "src")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(*arguments: str) -> tuple[subprocess.Popen, str]:
    """The command, and the URL it printed once serving."""
    environment = {**os.environ, "PYTHONPATH": SOURCE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen([sys.executable, "-m", "attnlab.cli", "serve", *arguments], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=environment)
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("serving on "):
            return process, line.split()[2]
    process.kill()
    raise AssertionError("the server did not start:\n" + "".join(lines))


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            json.loads(response.read())
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def _run(*arguments: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": SOURCE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "attnlab.cli", "serve", *arguments], capture_output=True, text=True,
                          env=environment, timeout=120)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_the_server_stops_cleanly_with_exit_code_0(tiny_gguf, stop) -> None:
    process, url = _start("--model", str(tiny_gguf), "--port", str(_free_port()))
    try:
        assert _get(url + "api/info") == 200
        process.send_signal(stop)
        output, _ = process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert "stopped" in output and "Traceback" not in output


def test_binding_beyond_the_loopback_needs_the_printed_token(tiny_gguf) -> None:
    port = _free_port()
    process, url = _start("--model", str(tiny_gguf), "--host", "0.0.0.0", "--port", str(port))
    try:
        assert "?token=" in url
        token = url.split("?token=")[1]
        bare = f"http://127.0.0.1:{port}/"
        assert _get(bare + "api/info") == 403
        assert _get(bare + "api/info?token=wrong") == 403
        assert _get(bare + "api/info?token=" + token) == 200
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0


def test_a_port_in_use_and_a_misspelt_model_are_one_line_errors(tiny_gguf) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = _run("--model", str(tiny_gguf), "--port", str(port))
    assert busy.returncode == 2
    assert busy.stderr.strip().splitlines() == [f"attnlab serve: error: port {port} is in use on 127.0.0.1: pass "
                                                f"--port with a free one (e.g. --port {port + 1})"]
    typo = _run("--model", "smolm2", "--port", str(_free_port()))
    assert typo.returncode == 2 and len(typo.stderr.strip().splitlines()) == 1
    assert "smolm2" in typo.stderr and "Traceback" not in typo.stderr
