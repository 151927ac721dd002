"""The model the explorer holds, and the one place its forwards run: one at a time, in order.

The model is opened once, at start, from what ``--model`` names (requests never name a model
or a file). Every call that touches it goes through :meth:`ModelSession.run`: an
``asyncio.Lock`` queues the requests and the call runs in a worker thread, so the event loop
keeps answering (a bad request gets its 4xx while a forward runs) and no two forwards ever
overlap. A queue longer than ``limits.max_waiting`` gets 503 at once instead of waiting.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

from .image_views import ImageExplorer, is_image_model
from .limits import RequestError, ServeLimits
from .text_views import TextExplorer

if TYPE_CHECKING:
    from ..hf.placement import Placement

__all__ = ["ModelSession", "open_session"]

Result = TypeVar("Result")


class ModelSession:
    """A model's explorer (text or image) behind a single-forward lock.

    Args:
        explorer: a :class:`~attnlab.serve.text_views.TextExplorer` or
            :class:`~attnlab.serve.image_views.ImageExplorer`.
        limits: the request bounds.

    Example:
        >>> session = ModelSession(TextExplorer(model, tokenizer, "tiny", ServeLimits()), ServeLimits())
        >>> await session.run(session.explorer.view, "a text", [])
    """

    def __init__(self, explorer: Union[TextExplorer, ImageExplorer], limits: ServeLimits) -> None:
        self.explorer, self.limits = explorer, limits
        self._lock: Optional[asyncio.Lock] = None  # made in the server's event loop
        self._waiting = 0
        self.forwards = 0  # calls run, for the tests and the benchmark

    @property
    def kind(self) -> str:
        return self.explorer.kind

    async def run(self, call: Callable[..., Result], *args: Any) -> Result:
        """``call(*args)`` in a worker thread once every earlier call has finished.

        Raises:
            RequestError: 503 when ``limits.max_waiting`` calls already wait.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        if self._waiting >= self.limits.max_waiting:
            raise RequestError(503, f"{self._waiting} requests are waiting for the model; try again shortly")
        self._waiting += 1
        try:
            async with self._lock:
                self.forwards += 1
                return await asyncio.to_thread(call, *args)
        finally:
            self._waiting -= 1


def open_session(spec: str, *, dtype: str = "float32", limits: Optional[ServeLimits] = None,
                 placement: Optional["Placement"] = None) -> ModelSession:
    """Open the model ``spec`` names (what ``attnlab.load`` opens, a transformers directory, or a
    vision transformer directory) and its explorer; ``placement``: accelerate's device map
    (``--device-map``).

    Raises:
        FileNotFoundError, ValueError: ``spec`` opens no model the explorer can show (the
            message says why, as every command's ``--model`` does).
    """
    from ..workflows.resolve import directory_config, open_vision_model, resolve_model

    limits = limits or ServeLimits()
    if Path(spec).is_dir() and is_image_model(directory_config(spec)):
        model, preprocessing = open_vision_model(spec, flag="--model", dtype=dtype, placement=placement,
                                                 takes="vision model directory (ViT, DeiT, DINOv2)")
        return ModelSession(ImageExplorer(model, preprocessing, spec, limits), limits)
    resolved = resolve_model(spec, dtype=dtype, placement=placement)
    resolved.refuse_encoder_decoder("the explorer reads one sequence's attention",
                                    "attnlab inspect --source --target draws its encoder, decoder and cross maps")
    return ModelSession(TextExplorer(resolved.model, resolved.tokenizer, spec, limits), limits)
