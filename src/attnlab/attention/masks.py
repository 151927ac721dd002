"""Attention masks: one convention, builders and validation.

Convention, everywhere in attnlab:

* A **boolean** mask says where attention is allowed: ``True`` (or ``1`` in an
  integer mask) means "this query may attend to this key", ``False`` means it may not.
  This is the polarity of ``torch.nn.functional.scaled_dot_product_attention`` and of
  the article's ``masked_fill(mask == 0, ...)``. ``torch.nn.MultiheadAttention`` uses
  the opposite polarity for its boolean masks; convert with ``~mask`` at that boundary.
* A **floating-point** mask is *added* to the attention scores (``0`` keeps a score,
  ``-inf`` removes it).

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length.
An attention mask broadcasts to ``[B, H, T, S]``; a *padding* mask is ``[B, S]`` with
``True`` on real tokens.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "padding_mask",
    "padding_mask_from_ids",
    "causal_mask",
    "padding_to_attention_mask",
    "combine_masks",
    "validate_attention_mask",
    "mask_to_additive",
    "head_mask_scale",
]


def padding_mask(lengths: Tensor | Sequence[int], max_len: Optional[int] = None) -> Tensor:
    """Padding mask from sequence lengths.

    Args:
        lengths: number of real tokens in each sequence.
        max_len: width of the mask; defaults to the longest length.

    Returns:
        ``[B, S]`` bool tensor, ``True`` on real tokens (may be attended to).

    Example:
        >>> padding_mask([2, 3])
        tensor([[ True,  True, False],
                [ True,  True,  True]])
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D [B], got shape {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    width = longest if max_len is None else max_len
    if width < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest length {longest}")
    positions = torch.arange(width, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)  # [B, S]


def padding_mask_from_ids(input_ids: Tensor, pad_id: int) -> Tensor:
    """Padding mask from token ids: ``True`` where ``input_ids != pad_id``.

    Shape:
        input_ids ``[B, S]`` -> ``[B, S]`` bool.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, S], got shape {tuple(input_ids.shape)}")
    return input_ids != pad_id


def causal_mask(
    query_len: int, key_len: Optional[int] = None, *, device: Optional[torch.device] = None
) -> Tensor:
    """Causal mask: query ``i`` may attend to keys ``0..i`` (top-left aligned).

    This matches ``is_causal=True`` of ``F.scaled_dot_product_attention``.

    Returns:
        ``[T, S]`` bool tensor.
    """
    key_len = query_len if key_len is None else key_len
    return torch.ones(query_len, key_len, dtype=torch.bool, device=device).tril()


def padding_to_attention_mask(mask: Tensor) -> Tensor:
    """Turn a ``[B, S]`` padding mask into an attention mask ``[B, 1, 1, S]``."""
    if mask.dim() != 2:
        raise ValueError(f"padding mask must be [B, S], got shape {tuple(mask.shape)}")
    return mask[:, None, None, :]


def mask_to_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean mask (``True`` = may attend) to an additive float mask (0 / -inf)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask_to_additive expects a bool mask, got {mask.dtype}")
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill_(~mask, float("-inf"))


def combine_masks(*masks: Optional[Tensor]) -> Optional[Tensor]:
    """Combine attention masks that all follow attnlab's convention.

    Boolean masks are combined with logical AND (a pair may attend only if every mask
    allows it); if any mask is floating point, boolean ones are made additive and all
    are summed. ``None`` entries are skipped; returns ``None`` if nothing is left.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    float_masks = [m for m in present if m.dtype.is_floating_point]
    if not float_masks:
        combined = present[0].bool()
        for m in present[1:]:
            combined = combined & m.bool()
        return combined
    dtype = float_masks[0].dtype
    combined = None
    for m in present:
        term = m if m.dtype.is_floating_point else mask_to_additive(m.bool(), dtype)
        combined = term if combined is None else combined + term
    return combined


def _broadcasts(dim_size: int, target: int) -> bool:
    return dim_size == 1 or dim_size == target


def validate_attention_mask(
    mask: Optional[Tensor],
    *,
    batch: int,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
    name: str = "mask",
) -> Optional[Tensor]:
    """Check an attention mask and bring it to rank 4.

    Accepted shapes: ``[T, S]``, ``[B, T, S]`` and ``[B, H, T, S]``, where every
    dimension may also be 1 (broadcast). Integer masks are read as booleans (``1`` =
    may attend); float masks must have the scores' dtype and are additive.

    Returns:
        The mask as a rank-4 tensor that broadcasts to ``[B, H, T, S]`` (bool or
        ``dtype``), or ``None``.

    Raises:
        TypeError: the mask is not a tensor or has an unusable dtype.
        ValueError: the mask's rank or shape does not broadcast to ``[B, H, T, S]``.
    """
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        pass
    elif mask.dtype.is_floating_point:
        if mask.dtype != dtype:
            raise TypeError(
                f"{name} is a float (additive) mask of dtype {mask.dtype}, but the scores are "
                f"{dtype}; pass a bool mask (True = may attend) or an additive mask of dtype {dtype}"
            )
    elif mask.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        mask = mask != 0
    else:
        raise TypeError(f"{name} has unsupported dtype {mask.dtype}; expected bool, integer or float")
    expected = f"a shape that broadcasts to [B, H, T, S] = [{batch}, {heads}, {query_len}, {key_len}]"
    if mask.dim() == 2:
        mask = mask[None, None]
    elif mask.dim() == 3:
        mask = mask[:, None]
    elif mask.dim() != 4:
        raise ValueError(
            f"{name} must have rank 2 [T, S], 3 [B, T, S] or 4 [B, H, T, S]; got rank "
            f"{mask.dim()} with shape {tuple(mask.shape)}"
        )
    target = (batch, heads, query_len, key_len)
    if not all(_broadcasts(size, want) for size, want in zip(mask.shape, target)):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}; expected {expected}")
    return mask


def head_mask_scale(head_mask: Tensor, num_heads: int, batch: int) -> Tensor:
    """Per-head multipliers ``[H]`` or ``[B, H]`` as a ``[B|1, H, 1, 1]`` view.

    A head mask scales each head's output (0 switches a head off); it is not an
    attention mask.
    """
    H = num_heads
    if head_mask.dim() == 1 and head_mask.shape[0] == H:
        return head_mask.view(1, H, 1, 1)
    if head_mask.dim() == 2 and head_mask.shape[1] == H and head_mask.shape[0] in (1, batch):
        return head_mask.view(-1, H, 1, 1)
    raise ValueError(f"head_mask must be [H]=[{H}] or [B, H]=[{batch}, {H}], got {tuple(head_mask.shape)}")
