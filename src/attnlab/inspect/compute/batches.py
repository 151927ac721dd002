"""What a batch from the analyzer's dataloader may look like.

Dimension letters: ``B`` batch, ``T`` length.

Three forms are accepted, and all become an :class:`AnalysisBatch`:

* a tensor ``input_ids [B, T]``;
* a tuple or list whose first item is ``input_ids`` (the article's ``batch[0]``) and whose
  optional second item is ``labels [B]`` (the article's ``inputs, targets = batch``);
* a mapping with ``input_ids`` and optionally ``mask`` (or ``attention_mask``) ``[B, T]``
  with ``True``/1 on real tokens, ``labels`` ``[B]`` and ``alignment`` ``[B, T, T]``
  bool (``True`` where query ``t`` should align with key ``s``).

Without a mask, padding is found from ``pad_id`` (``input_ids != pad_id``); with neither,
every position counts as a real token.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional

import torch
from torch import Tensor

__all__ = ["AnalysisBatch", "as_analysis_batch"]


class AnalysisBatch(NamedTuple):
    """One batch, normalised.

    Attributes:
        input_ids: ``[B, T]`` integer token ids.
        mask: ``[B, T]`` bool, ``True`` on real tokens.
        labels: ``[B]`` (or whatever the loss takes), or ``None``.
        alignment: ``[B, T, T]`` bool reference alignment, or ``None``.
        mask_given: whether the batch carried its own mask (then it is passed to the model).
    """

    input_ids: Tensor
    mask: Tensor
    labels: Optional[Tensor]
    alignment: Optional[Tensor]
    mask_given: bool


def _check_ids(input_ids: Any) -> Tensor:
    if not isinstance(input_ids, Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dim() != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must be an integer tensor [B, T], "
            f"got dtype {input_ids.dtype} shape {tuple(input_ids.shape)}"
        )
    return input_ids


def as_analysis_batch(batch: Any, pad_id: Optional[int] = None) -> AnalysisBatch:
    """Normalise one dataloader batch (see the module docstring for the accepted forms).

    Args:
        batch: a tensor, tuple/list or mapping as described above.
        pad_id: id of the padding token, used when the batch has no mask.

    Returns:
        :class:`AnalysisBatch`.

    Shape:
        ``input_ids`` and ``mask`` ``[B, T]``; ``alignment`` ``[B, T, T]``.
    """
    labels = alignment = mask = None
    if isinstance(batch, Tensor):
        input_ids = batch
    elif isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ValueError(f"a dict batch needs an 'input_ids' entry, got keys {sorted(batch)}")
        input_ids = batch["input_ids"]
        mask = batch.get("mask", batch.get("attention_mask"))
        labels = batch.get("labels")
        alignment = batch.get("alignment")
    elif isinstance(batch, (tuple, list)) and batch:
        input_ids = batch[0]
        labels = batch[1] if len(batch) > 1 else None
    else:
        raise TypeError(
            f"batch must be a tensor of ids, a tuple/list (ids, labels) or a dict with 'input_ids', "
            f"got {type(batch).__name__}"
        )
    input_ids = _check_ids(input_ids)
    B, T = input_ids.shape
    mask_given = mask is not None
    if mask is None:
        mask = input_ids != pad_id if pad_id is not None else torch.ones(B, T, dtype=torch.bool)
    if not isinstance(mask, Tensor) or mask.shape != (B, T):
        raise ValueError(
            f"mask must be a [B, T] = [{B}, {T}] tensor with True on real tokens, "
            f"got {tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}"
        )
    if alignment is not None:
        if not isinstance(alignment, Tensor) or alignment.shape != (B, T, T):
            raise ValueError(
                f"alignment must be a bool tensor [B, T, T] = [{B}, {T}, {T}], "
                f"got {tuple(alignment.shape) if isinstance(alignment, Tensor) else type(alignment).__name__}"
            )
        alignment = alignment.bool()
    return AnalysisBatch(input_ids, mask.bool().to(input_ids.device), labels, alignment, mask_given)
