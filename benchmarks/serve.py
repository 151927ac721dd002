"""``attnlab serve``'s latency, measured through its HTTP API on localhost.

For each model: a real server (uvicorn on 127.0.0.1, a free port) and a prompt of ``--tokens``
tokens (512 by default); then

* **first view**: ``POST /api/view`` of a text not seen before (two texts of the same length
  alternate, so every view runs the forward: tokens, the statistics grid, the prediction);
* **head switch-off**: the same text again with one more head off (a new forward each time);
* **head click**: ``POST /api/map`` of one head of the text just viewed (the kept maps; pooled
  to 128 x 128 blocks past 128 tokens);
* **load**: ``--clients`` clients for ``--seconds`` seconds, each sending views of a short text
  with a random head off and head clicks, as fast as answers come: requests answered, errors,
  lost requests (sent but never answered), p50/p95 latency.

Latencies are wall-clock seconds per request, client side (HTTP included), p50 and p95 over
``--repeats`` requests. The CPU and how busy it was are printed first and last: on a shared
machine the figures are provisional.

Run::

    python benchmarks/serve.py                        # smollm2 and minilm, 512 tokens, 8 clients x 30 s
    python benchmarks/serve.py --model smollm2 --repeats 20
    python benchmarks/serve.py --quick                # a tiny random decoder, seconds (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import torch

from attnlab._machine import machine_line


def _percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return f"{statistics.median(ordered):.3f} / {p95:.3f}"


class _Server:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.server.install_signal_handlers = lambda: None
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}/"

    def post(self, path: str, body: dict) -> tuple[int, float]:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            error.read()
            status = error.code
        return status, time.perf_counter() - started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def _text_of(tokenizer: Any, tokens: int, first: str) -> tuple[str, int]:
    """A text of at most ``tokens`` tokens (as many as fit), starting with ``first``."""
    words = [first] + ("the cat sat on the mat while the dog watched the birds in the old garden "
                       "and the sun went down over the quiet town").split() * (tokens // 4 + 8)
    low, high = 1, len(words)
    while low < high:  # the most words whose tokens fit
        middle = (low + high + 1) // 2
        if len(tokenizer.encode(" ".join(words[:middle])).ids) <= tokens:
            low = middle
        else:
            high = middle - 1
    text = " ".join(words[:low])
    return text, len(tokenizer.encode(text).ids)


def _latency(server: _Server, session: Any, tokens: int, repeats: int) -> dict[str, Any]:
    explorer = session.explorer
    texts = [_text_of(explorer.tokenizer, tokens, first) for first in ("once", "twice")]
    heads = [(layer + 1, head + 1) for layer, count in enumerate(explorer.heads) for head in range(count)]
    first, off, click = [], [], []
    server.post("api/view", {"text": texts[0][0]})  # warm-up: allocators, kernels
    for repeat in range(repeats):
        text = texts[repeat % 2][0]
        status, seconds = server.post("api/view", {"text": text})
        assert status == 200, status
        first.append(seconds)
        layer, head = heads[(7 * repeat) % len(heads)]
        status, seconds = server.post("api/map", {"text": text, "layer": layer, "head": head})
        assert status == 200, status
        click.append(seconds)
        status, seconds = server.post("api/view", {"text": text, "off": [f"{layer}:{head}"]})
        assert status == 200, status
        off.append(seconds)
    return {"tokens": texts[0][1], "first": first, "off": off, "click": click}


def _load(server: _Server, session: Any, clients: int, seconds: float) -> dict[str, Any]:
    explorer = session.explorer
    text, _ = _text_of(explorer.tokenizer, 32, "today")
    heads = [f"{layer + 1}:{head + 1}" for layer, count in enumerate(explorer.heads) for head in range(count)]
    sent, answered, errors, latencies = [0], [0], [], []
    lock = threading.Lock()

    def client(index: int) -> None:
        chooser = random.Random(index)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            off = [chooser.choice(heads)]
            path, body = (("api/view", {"text": text, "off": off}) if chooser.random() < 0.7 else
                          ("api/map", {"text": text, "off": off, "layer": 1, "head": 1}))
            with lock:
                sent[0] += 1
            try:
                status, elapsed = server.post(path, body)
            except OSError as error:
                with lock:
                    errors.append(str(error))
                continue
            with lock:
                answered[0] += 1
                latencies.append(elapsed)
                if status != 200:
                    errors.append(f"HTTP {status}")

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"sent": sent[0], "answered": answered[0], "errors": errors, "latencies": latencies}


def _tiny_session(limits: Any) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from attnlab.data.tokenizer import Tokenizer as AttnlabTokenizer
    from attnlab.layers.decoder_config import DecoderConfig
    from attnlab.models.decoder.causal_lm import DecoderForCausalLM
    from attnlab.serve.session import ModelSession
    from attnlab.serve.text_views import TextExplorer

    words = sorted(set("today once twice the cat sat on mat while dog watched birds in old garden and sun went "
                       "down over quiet town".split()))
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]"] + words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(0)
    model = DecoderForCausalLM(DecoderConfig(vocab_size=len(words) + 1, d_model=32, num_layers=2, num_heads=4,
                                             d_ff=64, max_len=1024))
    return ModelSession(TextExplorer(model, AttnlabTokenizer(backend), "tiny random decoder", limits), limits)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=None, help="a model (repeat; default smollm2 and minilm)")
    parser.add_argument("--tokens", type=int, default=512, help="prompt length in tokens (default 512)")
    parser.add_argument("--repeats", type=int, default=10, help="requests per latency figure (default 10)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients of the load test (default 8)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the load test (default 30)")
    parser.add_argument("--quick", action="store_true", help="a tiny random decoder, 3 repeats, 2 s of load")
    args = parser.parse_args(argv)
    from attnlab.serve.app import create_app
    from attnlab.serve.limits import ServeLimits
    from attnlab.serve.session import open_session

    if args.quick:
        args.repeats, args.seconds, args.tokens = 3, min(args.seconds, 2.0), min(args.tokens, 128)
    print(machine_line())
    rows, loads = [], []
    names = ["tiny"] if args.quick else (args.model or ["smollm2", "minilm"])
    for name in names:
        limits = ServeLimits(max_tokens=args.tokens)
        started = time.perf_counter()
        session = _tiny_session(limits) if args.quick else open_session(name, limits=limits)
        opened = time.perf_counter() - started
        server = _Server(create_app(session))
        try:
            found = _latency(server, session, args.tokens, args.repeats)
            load = _load(server, session, args.clients, args.seconds)
        finally:
            server.stop()
        kind = session.explorer.kind
        rows.append(f"| {name} ({kind}) | {found['tokens']} | {_percentiles(found['first'])} | "
                    f"{_percentiles(found['off'])} | {_percentiles(found['click'])} | {opened:.1f} |")
        lost = load["sent"] - load["answered"] - len([e for e in load["errors"] if not e.startswith("HTTP")])
        loads.append(f"| {name} | {args.clients} x {args.seconds:g} s | {load['answered']} | {len(load['errors'])} | "
                     f"{lost} | {_percentiles(load['latencies'])} |")
        del session
    print(f"\nlatency, seconds per request (p50 / p95 over {args.repeats} requests, client side)\n")
    print("| model | prompt tokens | first view | head switch-off | head click (map) | load s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nload test: short text (32 tokens), 70 % views with a random head off, 30 % head clicks\n")
    print("| model | clients x time | answered | errors | lost | p50 / p95 s |")
    print("|---|---|---|---|---|---|")
    print("\n".join(loads))
    print()
    print(machine_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
