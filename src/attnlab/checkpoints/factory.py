"""Building a task model's encoder: from scratch, or from a pretrained checkpoint."""

from __future__ import annotations

from typing import Any, Optional

from ..models.encoder import TransformerEncoder
from .encoders.loading import load_tokenizer
from .loading import from_pretrained

__all__ = ["build_encoder", "load_pretrained_tokenizer"]


def build_encoder(vocab_size: int, *, pretrained: Optional[str] = None, **options: Any) -> TransformerEncoder:
    """A fresh :class:`TransformerEncoder`, or the pretrained one named by ``pretrained``.

    For a pretrained encoder (any family ``attnlab.load`` opens; this is its alias
    :func:`~attnlab.checkpoints.loading.from_pretrained`) the checkpoint decides the architecture (``vocab_size`` and
    the shape options are ignored); only the training-time options ``dropout`` and
    ``attention_dropout`` apply, so that ``attention_dropout=0`` keeps the fused kernel.
    """
    if pretrained:
        # The encoder only: a fine-tuned checkpoint's own head is left behind for the new task's.
        return from_pretrained(
            pretrained, task="encoder", strict=False,
            dropout=options.get("dropout"), attention_dropout=options.get("attention_dropout"),
        )
    return TransformerEncoder(vocab_size, **options)


def load_pretrained_tokenizer(name: str):
    """The ``tokenizers.Tokenizer`` that goes with the pretrained encoder ``name``."""
    return load_tokenizer(name)
