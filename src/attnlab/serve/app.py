"""The explorer's web app: the page, its assets and a JSON API, on Starlette.

Routes (every ``POST`` takes a JSON object and answers one; heads are ``"LAYER:HEAD"``
counted from 1, as ``--mask-heads 2:1``):

=======================  ===============================================================
``GET /``                the page (``assets/index.html``); ``?token=`` sets the cookie
``GET /assets/NAME``     its style and script, and the report pages' ``report.css``
``GET /api/info``        the model: kind, layers, heads per layer, methods, bounds
``POST /api/view``       ``{text, off}``: tokens, statistics grid, prediction
``POST /api/map``        ``{text, off, layer, head, rows}``: one head's map (whole, rows or pooled)
``POST /api/step``       ``{text, generated, off}``: the next token and what the last one attended to
``POST /api/explain``    ``{text, method, off}``: per-token scores (of the model with those heads off)
``POST /api/patch``      ``{text, source, heads}``: the heads patched from the source's run
``POST /api/image``      the PNG or JPEG bytes (``?off=2:1,3:4``): overlays, rollout, labels
=======================  ===============================================================

Every refusal is a 4xx ``{"error": "..."}``; an unexpected failure is a 500 with the same
shape, and the server keeps serving. With a token (required when binding beyond the loopback)
every request must carry it (``?token=``, the ``X-Attnlab-Token`` header, or the cookie the
page gets) or gets 403. Bound to the loopback, requests must name a loopback host (a page on
another site cannot reach the explorer through a name that resolves to 127.0.0.1).
"""

from __future__ import annotations

import hmac
import logging
from functools import lru_cache
from importlib.resources import files
from typing import Any, Awaitable, Callable, Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..inspect.draw._assets import asset
from .image_views import ImageExplorer
from .limits import RequestError
from .requests import choice_field, heads_field, ids_field, int_field, parse_body, rows_field, text_field
from .session import ModelSession

__all__ = ["create_app", "LOOPBACK_HOSTS"]

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
_COOKIE = "attnlab_token"
_ASSETS = {"serve.css": "text/css", "serve.js": "text/javascript", "report.css": "text/css"}
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
# The page loads nothing from elsewhere; the uploaded image is shown from a data: URL.
_PAGE_POLICY = "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'"


@lru_cache(maxsize=None)
def _own_asset(name: str) -> str:
    return files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=_HEADERS)


async def _read_body(request: Request, most: int) -> bytes:
    """The body, refused with 413 as soon as it passes ``most`` bytes (never read whole first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > most:
        raise RequestError(413, f"the request body has {declared} bytes; the explorer takes at most {most}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            raise RequestError(413, f"the request body passes {most} bytes; the explorer takes at most {most}")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(session: ModelSession, *, token: Optional[str] = None, local_only: bool = True) -> Starlette:
    """The Starlette app serving ``session``'s model.

    Args:
        session: the model and its single-forward lock.
        token: when set, every request must carry it (else 403).
        local_only: refuse requests whose ``Host`` is not a loopback name (403): for a server
            bound to the loopback.
    """
    explorer = session.explorer
    limits = session.limits
    image = isinstance(explorer, ImageExplorer)

    def api(handler: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return JSONResponse(await handler(request), headers=_HEADERS)
            except RequestError as error:
                return _error(error.status, error.message)
            except (ValueError, TypeError) as error:  # the library's own one-line refusal of an input
                return _error(422, str(error))
            except Exception as error:  # noqa: BLE001 - one request fails, the server keeps serving
                logger.exception("request %s failed", request.url.path)
                return _error(500, f"internal error ({type(error).__name__}): {error}")

        return endpoint

    async def body_of(request: Request) -> dict[str, Any]:
        return parse_body(await _read_body(request, limits.max_body_bytes), limits)

    def text_only() -> None:
        if image:
            raise RequestError(422, f"{explorer.name} reads images: send the picture to POST /api/image")

    async def info(request: Request) -> Any:
        return explorer.info()

    async def view(request: Request) -> Any:
        text_only()
        body = await body_of(request)
        text = text_field(body, "text", limits)
        off = heads_field(body, "off", explorer.heads)
        track = ids_field(body, "track", max(explorer.vocabulary, len(explorer.label_names or ())) or 1, 64)
        return await session.run(explorer.view, text, off, track)

    async def head_map(request: Request) -> Any:
        text_only()
        body = await body_of(request)
        text = text_field(body, "text", limits)
        off = heads_field(body, "off", explorer.heads)
        layer = int_field(body, "layer", low=1, high=len(explorer.heads))
        head = None if body.get("head") == "mean" else int_field(body, "head", low=1, high=explorer.heads[layer - 1])
        rows = rows_field(body, "rows", limits.max_tokens + limits.max_new_tokens, limits.map_cells)
        return await session.run(_checked_map, explorer, text, off, layer, head, rows)

    async def step(request: Request) -> Any:
        text_only()
        body = await body_of(request)
        text = text_field(body, "text", limits)
        generated = ids_field(body, "generated", max(explorer.vocabulary, 1), limits.max_new_tokens - 1)
        off = heads_field(body, "off", explorer.heads)
        return await session.run(explorer.step, text, generated, off)

    async def explain(request: Request) -> Any:
        text_only()
        body = await body_of(request)
        text = text_field(body, "text", limits)
        method = choice_field(body, "method", explorer.methods() or ["raw"])
        off = heads_field(body, "off", explorer.heads)
        return await session.run(explorer.explain, text, method, off)

    async def patch(request: Request) -> Any:
        text_only()
        body = await body_of(request)
        text = text_field(body, "text", limits)
        source = text_field(body, "source", limits)
        heads = heads_field(body, "heads", explorer.heads)
        return await session.run(explorer.patch, text, source, heads)

    async def image_view(request: Request) -> Any:
        if not image:
            raise RequestError(422, f"{explorer.name} reads text; images go to an image model (ViT, DeiT, DINOv2)")
        listed = [item for item in request.query_params.get("off", "").split(",") if item]
        off = heads_field({"off": listed}, "off", explorer.heads)
        data = await _read_body(request, limits.max_image_bytes)
        return await session.run(explorer.view, data, off)

    async def page(request: Request) -> Response:
        response = Response(_own_asset("index.html"), media_type="text/html",
                            headers={**_HEADERS, "Content-Security-Policy": _PAGE_POLICY})
        given = request.query_params.get("token")
        if token and given and hmac.compare_digest(given, token):
            response.set_cookie(_COOKIE, token, httponly=True, samesite="strict")
        return response

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return _error(404, f"no asset {name!r}")
        text = asset(name) if name == "report.css" else _own_asset(name)
        return Response(text, media_type=_ASSETS[name], headers=_HEADERS)

    async def not_found(request: Request, error: Exception) -> Response:
        status = getattr(error, "status_code", 404)
        return _error(status, f"{request.method} {request.url.path}: "
                              f"{'no such page' if status == 404 else 'method not allowed'} (the API is under /api/)")

    routes = [
        Route("/", page), Route("/assets/{name}", static),
        Route("/favicon.ico", lambda request: Response(status_code=204)),  # no icon; browsers ask
        Route("/api/info", api(info)),
        Route("/api/view", api(view), methods=["POST"]), Route("/api/map", api(head_map), methods=["POST"]),
        Route("/api/step", api(step), methods=["POST"]), Route("/api/explain", api(explain), methods=["POST"]),
        Route("/api/patch", api(patch), methods=["POST"]), Route("/api/image", api(image_view), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
    return _Guard(app, token, local_only)


def _checked_map(explorer: Any, text: str, off: Any, layer: int, head: Optional[int], rows: Any) -> Any:
    """A row range must lie inside the text, which is known once it is tokenized."""
    if rows is not None:
        _, tokens = explorer.encode(text)
        if rows[1] > len(tokens):
            raise RequestError(422, f"rows [{rows[0]}, {rows[1]}] pass the text's {len(tokens)} tokens")
    return explorer.head_map(text, off, layer, head, rows)


class _Guard:
    """ASGI middleware: the token (when set) and, bound to the loopback, a loopback ``Host``."""

    def __init__(self, app: Starlette, token: Optional[str], local_only: bool) -> None:
        self.app, self.token, self.local_only = app, token, local_only

    def _refusal(self, scope: dict) -> Optional[str]:
        request = Request(scope)
        if self.local_only:
            host = request.headers.get("host", "").rsplit(":", 1)[0] if not request.headers.get(
                "host", "").startswith("[") else request.headers.get("host", "").split("]")[0] + "]"
            if host not in LOOPBACK_HOSTS:
                return f"Host {host!r} is not this machine's loopback; open the explorer at http://127.0.0.1"
        if self.token:
            given = (request.query_params.get("token") or request.headers.get("x-attnlab-token")
                     or request.cookies.get(_COOKIE) or "")
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return "this explorer needs its token: open the URL it printed at start (…/?token=...)"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await _error(403, refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
