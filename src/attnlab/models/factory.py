"""Building a task model's encoder: from scratch, or from a pretrained checkpoint."""

from __future__ import annotations

import importlib
from typing import Any, Optional

from ..layers import TransformerEncoder

__all__ = ["build_encoder", "pretrained_module", "load_pretrained_tokenizer"]

_PRETRAINED_MODULE = "attnlab.models.pretrained"


def pretrained_module():
    """The pretrained-checkpoint module, imported on first use (it is optional here)."""
    try:
        return importlib.import_module(_PRETRAINED_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _PRETRAINED_MODULE:
            raise
        raise ValueError(
            f"model.pretrained is set, but this attnlab has no {_PRETRAINED_MODULE} module"
        ) from None


def build_encoder(vocab_size: int, *, pretrained: Optional[str] = None, **options: Any) -> TransformerEncoder:
    """A fresh :class:`TransformerEncoder`, or the pretrained one named by ``pretrained``
    (``options`` and ``vocab_size`` are then ignored: the checkpoint decides)."""
    if pretrained:
        return pretrained_module().from_pretrained(pretrained)
    return TransformerEncoder(vocab_size, **options)


def load_pretrained_tokenizer(name: str):
    """The ``tokenizers.Tokenizer`` that goes with the pretrained encoder ``name``."""
    return pretrained_module().load_tokenizer(name)
