"""The table module -> route that :func:`attnlab.hf.attach` fills and the attention function reads."""

from __future__ import annotations

import weakref
from typing import Any, Optional

from torch import nn

__all__ = ["route_of"]

_ROUTES: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()


def route_of(module: nn.Module) -> Optional[Any]:
    """The route of ``module`` inside an active :func:`attnlab.hf.attach` block, else ``None``."""
    return _ROUTES.get(module)
