"""Position information: sinusoidal, learned and rotary.

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``H`` heads, ``D`` head dim.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

from .._checks import check_memory, check_positive_int

from ..attention.rotary import RotaryEmbedding

__all__ = [
    "PositionalEncoding",
    "LearnedPositionalEmbedding",
    "PaddingOffsetPositionalEmbedding",
    "RotaryEmbedding",
    "sinusoidal_table",
]


def sinusoidal_table(max_len: int, d_model: int, *, base: float = 10000.0) -> Tensor:
    """The ``[max_len, d_model]`` table of Vaswani et al.: sin on even dims, cos on odd.

    Works for odd ``d_model`` (the last, even-indexed column is a sine).
    """
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # [T, 1]
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(base) / d_model)
    )  # [ceil(E/2)]
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return table.float()



class PositionalEncoding(nn.Module):
    """Fixed sinusoidal positions added to the input.

    Args:
        d_model: model width ``E`` (odd values work).
        max_len: longest sequence this module accepts.

    Shape:
        ``x``: ``[B, T, E]`` -> ``[B, T, E]``, with ``T <= max_len``.

    Example:
        >>> PositionalEncoding(7, max_len=16)(torch.zeros(2, 5, 7)).shape
        torch.Size([2, 5, 7])
    """

    def __init__(self, d_model: int, max_len: int = 5000, *, device=None, dtype=None) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        check_memory(12 * max_len * d_model, f"PositionalEncoding(d_model={d_model}, max_len={max_len})'s table",
                     "max_len is the longest input the model takes: use the length your texts need")
        self.d_model = d_model
        self.max_len = max_len
        table = sinusoidal_table(max_len, d_model).to(device=device, dtype=dtype or torch.float32)
        # Not persistent: the table is a pure function of (max_len, d_model).
        self.register_buffer("pe", table.unsqueeze(0), persistent=False)  # [1, max_len, E]

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be [B, T, {self.d_model}], got shape {tuple(x.shape)}")
        T = x.shape[1]
        if T > self.max_len:
            raise ValueError(
                f"sequence length {T} exceeds max_len={self.max_len} of PositionalEncoding; "
                f"build the model with a larger max_len or truncate the input"
            )
        return x + self.pe[:, :T].to(x.dtype)


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute positions (BERT style), added to the input.

    Shape:
        ``x``: ``[B, T, E]`` -> ``[B, T, E]``; optional ``position_ids`` ``[B, T]`` or ``[T]``.
    """

    def __init__(self, d_model: int, max_len: int = 512, *, device=None, dtype=None) -> None:
        super().__init__()
        check_positive_int("d_model", d_model)
        check_positive_int("max_len", max_len)
        self.d_model = d_model
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model, device=device, dtype=dtype)

    def forward(self, x: Tensor, position_ids: Optional[Tensor] = None) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be [B, T, {self.d_model}], got shape {tuple(x.shape)}")
        T = x.shape[1]
        if position_ids is None:
            if T > self.max_len:
                raise ValueError(
                    f"sequence length {T} exceeds max_len={self.max_len} of the learned positions; "
                    f"truncate the input to at most {self.max_len} tokens"
                )
            position_ids = torch.arange(T, device=x.device)
        elif position_ids.numel() and int(position_ids.max()) >= self.max_len:
            raise ValueError(
                f"position_ids reach {int(position_ids.max())}, but max_len={self.max_len}"
            )
        return x + self.embedding(position_ids)


class PaddingOffsetPositionalEmbedding(LearnedPositionalEmbedding):
    """Learned positions counted over real tokens only, from ``pad_id + 1`` (RoBERTa, XLM-R, MPNet).

    Position ``p`` of a real token is ``pad_id + 1 +`` the number of real tokens before it;
    padding tokens get position ``pad_id``. This is fairseq's numbering, which RoBERTa-style
    checkpoints were trained with: the table holds ``max_len`` rows of which the first
    ``pad_id + 1`` are never used by real tokens.

    Args:
        d_model: embedding width.
        max_len: rows of the table (HuggingFace's ``max_position_embeddings``).
        pad_id: the padding token id the numbering starts after.

    Shape:
        ``x`` ``[B, T, E]`` and ``input_ids`` ``[B, T]`` -> ``[B, T, E]``.
    """

    def __init__(self, d_model: int, max_len: int, pad_id: int, *, device=None, dtype=None) -> None:
        super().__init__(d_model, max_len, device=device, dtype=dtype)
        if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < max_len - 1:
            raise ValueError(f"pad_id must be an int in [0, max_len - 1 = {max_len - 1}), got {pad_id!r}")
        self.pad_id = pad_id

    def position_ids(self, input_ids: Tensor) -> Tensor:
        """``[B, T]`` position ids for ``input_ids`` ``[B, T]``."""
        real = input_ids.ne(self.pad_id).long()  # [B, T]
        return torch.cumsum(real, dim=1) * real + self.pad_id

    def forward(
        self, x: Tensor, position_ids: Optional[Tensor] = None, *, input_ids: Optional[Tensor] = None
    ) -> Tensor:
        if position_ids is None:
            if input_ids is None:
                raise ValueError("PaddingOffsetPositionalEmbedding needs input_ids (or position_ids)")
            T = input_ids.shape[1]
            if T > self.max_len - self.pad_id - 1:
                raise ValueError(
                    f"sequence length {T} exceeds the {self.max_len - self.pad_id - 1} positions of this "
                    f"checkpoint; truncate the input"
                )
            position_ids = self.position_ids(input_ids)
        return super().forward(x, position_ids)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, pad_id={self.pad_id}"
