"""Reading a request body into checked values: every field's type and bounds, before any compute.

Heads are named as on the command line (``--mask-heads 2:1``): ``"LAYER:HEAD"`` counted from
1. Each refusal is a :class:`~attnlab.serve.limits.RequestError` whose message names the
field, what came in and what was expected.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from .limits import RequestError, ServeLimits

__all__ = ["parse_body", "text_field", "heads_field", "int_field", "rows_field", "ids_field", "choice_field"]


def parse_body(raw: bytes, limits: ServeLimits) -> dict[str, Any]:
    """The JSON object a request sent.

    Raises:
        RequestError: 413 past ``limits.max_body_bytes``; 400 for bytes that are not UTF-8,
            text that is not JSON, or JSON that is not an object.
    """
    if len(raw) > limits.max_body_bytes:
        raise RequestError(413, f"the request body has {len(raw)} bytes; the explorer takes at most "
                                f"{limits.max_body_bytes}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"the request body is not UTF-8 (byte {error.start}): send JSON text") from None
    if not text.strip():
        raise RequestError(400, "the request body is empty: send a JSON object such as {\"text\": \"...\"}")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"the request body is not JSON ({error.msg} at line {error.lineno} column "
                                f"{error.colno})") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def text_field(body: dict[str, Any], name: str, limits: ServeLimits, *, required: bool = True) -> Optional[str]:
    """A non-empty string of at most ``limits.max_chars`` characters."""
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestError(400, f"{name} must be a string, got {_kind(value)}")
    if not value.strip():
        raise RequestError(400, f"{name} is empty: type a text")
    if len(value) > limits.max_chars:
        raise RequestError(413, f"{name} has {len(value)} characters; the explorer takes at most {limits.max_chars}")
    return value


def int_field(body: dict[str, Any], name: str, *, low: int, high: int, default: Optional[int] = None) -> int:
    """An int in ``low..high`` (``default`` when absent)."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{name} must be an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise RequestError(422, f"{name} must lie in {low}..{high}, got {value}")
    return value


def choice_field(body: dict[str, Any], name: str, choices: Sequence[str], *, default: Optional[str] = None) -> str:
    """One of ``choices``."""
    value = body.get(name, default)
    if not isinstance(value, str):
        raise RequestError(400, f"{name} must be a string, one of {', '.join(choices)}; got {_kind(value)}")
    if value not in choices:
        raise RequestError(422, f"{name} {value!r} is not one of {', '.join(choices)}")
    return value


def heads_field(body: dict[str, Any], name: str, heads: Sequence[int]) -> list[tuple[int, int]]:
    """``["2:1", "3:4"]`` -> ``[(2, 1), (3, 4)]`` (1-based), each head one the model has.

    Args:
        heads: heads per layer, layer 1 first.
    """
    value = body.get(name, [])
    if not isinstance(value, list):
        raise RequestError(400, f"{name} must be a list of \"LAYER:HEAD\" strings counted from 1 (e.g. [\"2:1\"]), "
                                f"got {_kind(value)}")
    if len(value) > sum(heads):
        raise RequestError(422, f"{name} lists {len(value)} heads; the model has {sum(heads)}")
    found = []
    for item in value:
        try:
            layer, head = (int(part) for part in item.split(":"))
        except (AttributeError, ValueError):
            raise RequestError(400, f"{name} takes \"LAYER:HEAD\" strings counted from 1 (e.g. \"2:1\"), "
                                    f"got {item!r}") from None
        if not 1 <= layer <= len(heads):
            raise RequestError(422, f"{name}: layer {layer} does not exist; the model has layers 1..{len(heads)}")
        if not 1 <= head <= heads[layer - 1]:
            raise RequestError(422, f"{name}: head {head} of layer {layer} does not exist; layer {layer} has "
                                    f"heads 1..{heads[layer - 1]}")
        found.append((layer, head))
    return sorted(set(found))


def rows_field(body: dict[str, Any], name: str, length: int, most: int) -> Optional[tuple[int, int]]:
    """``[start, stop)`` query rows, 0-based, at most ``most`` of them, inside ``length``."""
    value = body.get(name)
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        raise RequestError(400, f"{name} must be [START, STOP], two integers (rows START..STOP-1), got {value!r}")
    start, stop = value
    if not 0 <= start < stop <= length:
        raise RequestError(422, f"{name} [{start}, {stop}] must satisfy 0 <= START < STOP <= {length} (the text's "
                                f"tokens)")
    if stop - start > most:
        raise RequestError(422, f"{name} asks for {stop - start} rows; at most {most} at a time")
    return start, stop


def ids_field(body: dict[str, Any], name: str, vocabulary: int, most: int) -> list[int]:
    """A list of at most ``most`` token ids below ``vocabulary``."""
    value = body.get(name, [])
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise RequestError(400, f"{name} must be a list of token ids (integers), got {_kind(value)}")
    if len(value) > most:
        raise RequestError(413, f"{name} holds {len(value)} tokens; the explorer generates at most {most} "
                                f"(start again from a new prompt)")
    if any(not 0 <= v < vocabulary for v in value):
        raise RequestError(422, f"{name} holds ids outside the vocabulary 0..{vocabulary - 1}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    shown = json.dumps(value) if isinstance(value, (int, float, bool)) else type(value).__name__
    return shown if len(shown) < 40 else type(value).__name__
