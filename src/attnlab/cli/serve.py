"""``attnlab serve``: load a model once and explore it in the browser.

Binds 127.0.0.1 by default. Any other address needs a token, which is made at start (or
given with ``--token``) and printed in the URL, as Jupyter does; requests without it get 403.
The port is checked before the model is loaded, so a port in use costs no wait. Ctrl-C and
SIGTERM stop the server cleanly (uvicorn finishes the requests in flight) with exit code 0.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import secrets
import signal
import socket

from ._model_options import MODEL_HELP, add_dtype_argument, add_placement_arguments, placement_from_args

__all__ = ["add_arguments", "run", "is_loopback"]

DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help=MODEL_HELP + "; or a vision transformer directory (ViT)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1, this machine only); any other address needs "
                             "the token printed at start")
    parser.add_argument("--token", default=None,
                        help="the token requests must carry (default: none on 127.0.0.1, a random one elsewhere)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="longest text a request may send, in tokens (default 512; the model's context at most)")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="tokens a prompt may be continued by, step by step (default 64)")
    add_dtype_argument(parser)
    add_placement_arguments(parser)


def _check_port(host: str, port: int) -> None:
    """Refuse a port that is in use or not ours to bind, before the model is loaded."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port must lie in 1..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} is in use on {host}: pass --port with a free one "
                                 f"(e.g. --port {port + 1})") from None
            raise ValueError(f"cannot bind {host}:{port} ({error.strerror}): pass another --host or --port") from None


def run(args: argparse.Namespace) -> int:
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise ValueError("attnlab serve needs starlette and uvicorn: pip install 'attnlab[serve]'") from None
    from ..serve.app import create_app
    from ..serve.limits import ServeLimits
    from ..serve.session import open_session

    if args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    local = is_loopback(args.host)
    token = args.token if args.token is not None else (None if local else secrets.token_urlsafe(24))
    if args.token is not None and not args.token:
        raise ValueError("--token is empty; give a token, or leave --token out")
    _check_port(args.host, args.port)
    limits = ServeLimits(max_tokens=args.max_tokens, max_new_tokens=args.max_new_tokens)
    session = open_session(args.model, dtype=args.dtype, limits=limits, placement=placement_from_args(args))
    explorer = session.explorer
    print(f"{args.model}: {explorer.kind}, {len(explorer.heads)} layers x {max(explorer.heads)} heads")
    app = create_app(session, token=token, local_only=local)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    address = f"http://{'[' + shown + ']' if ':' in shown else shown}:{args.port}/"
    ready = f"serving on {address}{f'?token={token}' if token else ''}  (Ctrl-C stops)"

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:  # the socket listens: the address printed can be opened now
                print(ready, flush=True)

    server = Server(uvicorn.Config(app, host=args.host.strip("[]"), port=args.port, log_level="warning",
                                   access_log=False, timeout_graceful_shutdown=5))
    # uvicorn stops on Ctrl-C or SIGTERM, answers the requests in flight, then raises the signal
    # again for the handlers that were there before it: these, which end the command with 0.
    stops: list[int] = []
    previous = {number: signal.signal(number, lambda received, frame: stops.append(received))
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if not server.started:
        raise ValueError(f"the server could not start on {args.host}:{args.port} (see the line above)")
    print("stopped", flush=True)
    return 0
