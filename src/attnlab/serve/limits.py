"""What one request may ask of the explorer, and the error a request gets when it asks too much.

Every bound is checked before any compute, so a request that is too big costs the server
nothing but the check; the answer is a 4xx JSON ``{"error": ...}`` that names what was wrong
and what to do.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RequestError", "ServeLimits"]


class RequestError(Exception):
    """A request the explorer refuses: ``status`` (4xx) and a one-line ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on what one request may ask.

    Attributes:
        max_tokens: tokens of a text (a longer one is refused, not cut: what is shown is
            what was typed); also bounded by the model's own context.
        max_new_tokens: tokens generated step by step after a prompt.
        max_chars: characters of a text, checked before tokenizing.
        max_body_bytes: bytes of a JSON request body.
        max_image_bytes: bytes of an uploaded image.
        max_image_pixels: width x height of an uploaded image, checked before decoding it.
        max_waiting: requests queued behind the model before new ones get 503.
        map_cells: side of the largest map sent whole; a longer text's map is pooled into
            this many buckets per side, or sent as a range of at most this many rows.
        explain_tokens: tokens of a text explained by the methods that run the model once
            per token or per quadrature point (occlusion, integrated gradients).
    """

    max_tokens: int = 512
    max_new_tokens: int = 64
    max_chars: int = 20_000
    max_body_bytes: int = 256 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_waiting: int = 64
    map_cells: int = 128
    explain_tokens: int = 64

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_new_tokens", "max_chars", "max_body_bytes", "max_image_bytes",
                     "max_image_pixels", "max_waiting", "map_cells", "explain_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2, got {self.max_tokens}")
