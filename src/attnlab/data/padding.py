"""Padding: token-id lists to a ``[B, T]`` batch, and which id pads.

Dimension letters: ``B`` batch, ``T`` length.

One rule finds the padding id everywhere (training, ``inspect``, ``analyze``): the
tokenizer's own padding token (``[PAD]``, else ``<pad>``), else the model's
``config.pad_id`` (the first module that declares one), else the caller's default.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["PAD_TOKENS", "pad_token_ids", "tokenizer_pad_id", "model_pad_id", "pad_id_for"]

PAD_TOKENS = ("[PAD]", "<pad>")  # BERT-style, then SentencePiece/byte-BPE style


def pad_token_ids(
    sequences: Sequence[Sequence[int]], pad_id: int, length: Optional[int] = None
) -> tuple[Tensor, Tensor]:
    """Right-pad token-id lists into ``(input_ids, mask)``.

    Args:
        sequences: one list of token ids per row.
        pad_id: the id written after each row's tokens.
        length: ``T``; default the longest row. Rows longer than it are an error.

    Shape:
        -> ``input_ids`` ``[B, T]`` long, ``mask`` ``[B, T]`` bool (``True`` on real tokens).
    """
    longest = max((len(ids) for ids in sequences), default=0)
    T = longest if length is None else length
    if T < longest:
        raise ValueError(f"length must be >= the longest sequence ({longest}), got {length}")
    input_ids = torch.full((len(sequences), T), pad_id, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(sequences), T, dtype=torch.bool)  # [B, T], True on real tokens
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
        mask[row, : len(ids)] = True
    return input_ids, mask


def tokenizer_pad_id(tokenizer: Any, *, default: Optional[int] = None) -> Optional[int]:
    """The id of the tokenizer's padding token (one of :data:`PAD_TOKENS`), else ``default``."""
    for token in PAD_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return default


def model_pad_id(model: Any) -> Optional[int]:
    """The padding id declared by the model's (or a submodule's) ``config.pad_id``, if any."""
    modules = model.modules() if hasattr(model, "modules") else [model]
    for module in modules:
        pad_id = getattr(getattr(module, "config", None), "pad_id", None)
        if isinstance(pad_id, int) and not isinstance(pad_id, bool):
            return pad_id
    return None


def pad_id_for(tokenizer: Any = None, model: Any = None, *, default: int = 0) -> int:
    """The padding id by the one rule: the tokenizer's padding token, else the model's
    ``config.pad_id``, else ``default``."""
    for candidate in (
        None if tokenizer is None else tokenizer_pad_id(tokenizer),
        None if model is None else model_pad_id(model),
    ):
        if candidate is not None:
            return candidate
    return default
