"""The keep mask of a decoder's attention: causal, padding, sliding window.

Dimension letters: ``B`` batch, ``T`` new positions, ``S`` all positions (cached + new).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["decoder_attention_mask"]


def decoder_attention_mask(
    keep: Optional[Tensor],
    query_len: int,
    key_len: int,
    *,
    sliding_window: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> tuple[Optional[Tensor], bool]:
    """What the ``T`` newest positions of ``S`` may attend to, as the kernels want it.

    Query ``i`` sits at position ``S - T + i`` (bottom-right aligned: a cached step sees
    the whole prefix) and may attend to key ``j`` when ``j <= S - T + i``, the key is a
    real token and, with a window ``w``, ``S - T + i - j < w``.

    Args:
        keep: ``[B, S]`` bool, ``True`` on real tokens; ``None`` when there is no padding.
        query_len: ``T``.
        key_len: ``S`` (``>= T``).
        sliding_window: keys further back than this are not attended (Mistral).
        device: where to build the mask.

    Returns:
        ``(mask, is_causal)``: ``(None, True)`` when the plain top-left causal constraint
        says everything (no cache, no padding, no window in reach), so the fused kernel
        gets ``is_causal``; ``(None, False)`` when every key may be attended (one new
        token, no padding); else a bool ``[B|1, 1, T, S]`` keep mask and ``False``.
    """
    past = key_len - query_len
    window_bites = sliding_window is not None and key_len > sliding_window
    if keep is None and not window_bites:
        if past == 0:
            return None, True
        if query_len == 1:
            return None, False
    queries = torch.arange(past, key_len, device=device)[:, None]  # [T, 1] absolute positions
    keys = torch.arange(key_len, device=device)[None, :]  # [1, S]
    allowed = keys <= queries  # [T, S]
    if window_bites:
        allowed = allowed & (queries - keys < sliding_window)
    mask = allowed[None, None]  # [1, 1, T, S]
    if keep is not None:
        mask = mask & keep[:, None, None, :]  # [B, 1, T, S]
    return mask, False
