"""Attention masks: one contract, builders and validation.

The contract, everywhere in attnlab (stated once here; docstrings point to it):

* **Masks keep.** An argument named ``mask``, ``attention_mask``, ``visual_mask``,
  ``text_mask``, ``image_mask`` says where attention is allowed: ``True`` / ``1`` means
  "may attend", ``False`` / ``0`` "may not", in any dtype: bool, integer, or float holding
  only 0 and 1 (HuggingFace's ``attention_mask.float()``). This is the polarity of the
  article's ``masked_fill(mask == 0, ...)`` and of HuggingFace's ``attention_mask``. A
  float mask holding any other value is refused, never added to the scores.
* **Biases add.** An additive float term (``0`` keeps a score, ``-inf`` removes it, any
  other value shifts it) is only taken through an argument named ``attn_bias``.
* **Shapes.** A padding mask is ``[B, S]``, ``True`` on real tokens. An attention mask
  broadcasts to ``[B, H, T, S]`` (``[T, S]``, ``[B, T, S]``, ``[B, H, T, S]``, or the
  article's ``[B, 1, 1, S]``). A rank-2 mask given where an attention mask is expected is
  read as ``[T, S]`` when only that fits, as a ``[B, S]`` padding mask when only that
  fits, and refused when both fit (``B == T``), with a message naming ``attention_mask=``.
* **PyTorch's keywords keep PyTorch's meaning.** ``attn_mask``, ``src_mask`` and
  ``src_key_padding_mask`` are read exactly as ``torch.nn`` reads them (bool ``True`` =
  *may not* attend, float = additive) and converted (:func:`from_torch_mask`).
  ``key_padding_mask`` is refused: attnlab once read it with the opposite polarity, so
  either reading could silently be the wrong one; the message says what to pass.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = [
    "padding_mask",
    "padding_mask_from_ids",
    "causal_mask",
    "sliding_window_mask",
    "padding_to_attention_mask",
    "combine_masks",
    "validate_attention_mask",
    "validate_attention_bias",
    "mask_with_bias",
    "keep_mask",
    "from_torch_mask",
    "gather_masks",
    "refuse_key_padding_mask",
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


def sliding_window_mask(
    query_len: int, key_len: Optional[int] = None, *, window: int, device: Optional[torch.device] = None
) -> Tensor:
    """Local attention: query ``i`` may attend to keys ``j`` with ``|i - j| <= window``.

    Bidirectional (ModernBERT's local layers: ``window = local_attention // 2``).

    Returns:
        ``[T, S]`` bool tensor.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0 (keys on each side), got {window!r}")
    key_len = query_len if key_len is None else key_len
    query = torch.arange(query_len, device=device)[:, None]  # [T, 1]
    key = torch.arange(key_len, device=device)[None, :]  # [1, S]
    return (query - key).abs() <= window


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
    """Combine keep masks (any dtype, see :func:`keep_mask`) with logical AND.

    A pair may attend only if every mask allows it. ``None`` entries are skipped;
    returns ``None`` if nothing is left. Shapes broadcast against each other.
    """
    present = [keep_mask(m, name="mask") for m in masks if m is not None]
    if not present:
        return None
    combined = present[0]
    for m in present[1:]:
        combined = combined & m
    return combined


_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def keep_mask(mask: Tensor, *, name: str = "mask", bias_argument: Optional[str] = "attn_bias") -> Tensor:
    """A keep mask of any dtype as bool (``True`` = may attend).

    Bool passes through, integers are ``!= 0``, floats must hold only 0 and 1 (and at
    least one 1: a float mask of zeros would keep nothing as a keep mask and change
    nothing as an additive one).

    Args:
        mask: the mask.
        name: the argument's name, for errors.
        bias_argument: the argument that takes an additive bias where ``mask`` was
            given, named in the error for a float mask that is not 0/1; ``None`` if
            there is none.

    Raises:
        TypeError: not a tensor, an unusable dtype, or a float mask that is not 0/1.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if mask.dtype in _INTEGER_DTYPES:
        return mask != 0
    if not mask.dtype.is_floating_point:
        raise TypeError(f"{name} has unsupported dtype {mask.dtype}; expected bool, integer or float 0/1")
    ones = mask == 1
    if not bool((ones | (mask == 0)).all()):
        odd = mask[~(ones | (mask == 0))].flatten()[0].item()
        where = (
            f"pass an additive bias as {bias_argument}= instead"
            if bias_argument
            else "convert it to a bool mask, True where attention is allowed"
        )
        raise TypeError(
            f"{name} is a float mask holding {odd} besides 0 and 1; attnlab reads masks as keep masks "
            f"(1 = may attend), never as additive scores: {where}"
        )
    if mask.numel() and not bool(ones.any()):
        raise TypeError(
            f"{name} is a float mask of zeros only: as a keep mask it allows nothing, as an additive "
            f"mask it changes nothing; pass a bool mask (True = may attend)"
        )
    return ones


def validate_attention_mask(
    mask: Optional[Tensor],
    *,
    batch: int,
    heads: int,
    query_len: int,
    key_len: int,
    name: str = "mask",
    bias_argument: Optional[str] = "attn_bias",
    dtype: Optional[torch.dtype] = None,
) -> Optional[Tensor]:
    """Check a keep mask and bring it to a bool rank-4 tensor.

    Accepted shapes: ``[T, S]``, ``[B, T, S]`` and ``[B, H, T, S]``, where every
    dimension may also be 1 (broadcast); a rank-2 ``[B, S]`` padding mask is read as
    such when ``[T, S]`` does not fit, and refused as ambiguous when both fit. Any dtype
    (see :func:`keep_mask`).

    Returns:
        A bool rank-4 tensor that broadcasts to ``[B, H, T, S]``, or ``None``.

    Raises:
        TypeError: the mask is not a tensor, has an unusable dtype, or is a float mask
            that is not 0/1.
        ValueError: the mask's rank or shape does not broadcast to ``[B, H, T, S]``, or
            a rank-2 mask could be both ``[B, S]`` and ``[T, S]``.
    """
    del dtype  # accepted for callers that still pass the scores' dtype: a keep mask has none
    if mask is None:
        return None
    mask = keep_mask(mask, name=name, bias_argument=bias_argument)
    return _to_rank4(mask, batch, heads, query_len, key_len, name)


def validate_attention_bias(
    bias: Optional[Tensor],
    *,
    batch: int,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
    name: str = "attn_bias",
) -> Optional[Tensor]:
    """Check an additive bias and bring it to a rank-4 float tensor of ``dtype``.

    Shapes as for :func:`validate_attention_mask`, except that a rank-2 bias is always
    ``[T, S]``.

    Raises:
        TypeError: not a floating-point tensor (a bool or integer tensor is a keep mask:
            pass it as ``mask``).
        ValueError: the shape does not broadcast to ``[B, H, T, S]``.
    """
    if bias is None:
        return None
    if not isinstance(bias, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(bias).__name__}")
    if not bias.dtype.is_floating_point:
        raise TypeError(
            f"{name} is added to the scores and must be a float tensor, got {bias.dtype}; "
            f"pass a bool or 0/1 keep mask as mask= or attention_mask="
        )
    return _to_rank4(bias.to(dtype), batch, heads, query_len, key_len, name, padding_ok=False)


def mask_with_bias(mask: Optional[Tensor], bias: Optional[Tensor]) -> Optional[Tensor]:
    """One rank-4 term for the kernels: ``mask`` (bool) alone, or ``bias`` with ``-inf``
    where ``mask`` forbids; both already validated."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    return bias.masked_fill(~mask, float("-inf"))


def from_torch_mask(
    mask: Optional[Tensor], *, name: str, padding: bool
) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """Read a ``torch.nn`` mask keyword exactly as ``torch.nn`` does.

    ``torch.nn`` bool masks say where attention is *not* allowed (``True`` = masked out)
    and float masks are added to the scores. Returns ``(keep mask, additive bias)``, one
    of them ``None``. A padding mask (``src_key_padding_mask``, ``[B, S]``) comes back as
    ``[B, 1, 1, S]``.
    """
    if mask is None:
        return None, None
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(mask).__name__}")
    if padding:
        if mask.dim() != 2:
            raise ValueError(
                f"{name} must be [B, S] (torch.nn's padding mask), got shape {tuple(mask.shape)}"
            )
        mask = mask[:, None, None, :]  # [B, 1, 1, S]
    if mask.dtype == torch.bool:
        return ~mask, None
    if mask.dtype.is_floating_point:
        return None, mask
    raise TypeError(
        f"{name} follows torch.nn: a bool mask (True = may NOT attend) or a float additive one; "
        f"got dtype {mask.dtype}"
    )


def gather_masks(
    batch: int,
    heads: int,
    query_len: int,
    key_len: int,
    dtype: torch.dtype,
    *,
    mask: Optional[Tensor] = None,
    attention_mask: Optional[Tensor] = None,
    attn_bias: Optional[Tensor] = None,
    attn_mask: Optional[Tensor] = None,
) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The mask arguments of an attention module, each read by its own rules (see the
    contract above), as one rank-4 keep mask and one additive bias.

    Args:
        batch, heads, query_len, key_len: ``B``, ``H``, ``T``, ``S``.
        dtype: the scores' dtype, which a bias must match.
        mask: a keep mask broadcastable to ``[B, H, T, S]``.
        attention_mask: ``[B, S]`` (``True`` / 1 on real keys) or broadcastable to ``[B, H, T, S]``.
        attn_bias: an additive float term broadcastable to ``[B, H, T, S]``.
        attn_mask: as ``torch.nn.MultiheadAttention`` takes it: ``[T, S]`` or ``[B * H, T, S]``.

    Returns:
        ``(keep [B|1, H|1, T, S] or None, bias or None)``.

    Raises:
        ValueError, TypeError: an argument of the wrong shape or kind, named with what was expected.
    """
    B, H, T, S = batch, heads, query_len, key_len
    sizes = {"batch": B, "heads": H, "query_len": T, "key_len": S}
    keep = validate_attention_mask(mask, **sizes, name="mask")
    if attention_mask is not None:
        attention_mask = keep_mask(attention_mask, name="attention_mask", bias_argument="attn_bias")
        if attention_mask.dim() == 2:
            if attention_mask.shape != (B, S):
                raise ValueError(
                    f"attention_mask must be [B, S] = [{B}, {S}] with True/1 on real keys, "
                    f"got {tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask[:, None, None, :]  # [B, 1, 1, S]
        attention_mask = validate_attention_mask(attention_mask, **sizes, name="attention_mask")
    bias = validate_attention_bias(attn_bias, **sizes, dtype=dtype)
    torch_keep, torch_bias = from_torch_mask(attn_mask, name="attn_mask", padding=False)
    for name, term in (("keep", torch_keep), ("bias", torch_bias)):
        if term is None:
            continue
        if term.dim() == 2:
            term = term[None, None]  # [1, 1, T, S]: torch.nn's 2-D attn_mask is always [T, S]
        elif term.dim() == 3 and term.shape[0] == B * H:
            term = term.view(B, H, *term.shape[1:])  # torch.nn's [B * H, T, S]
        elif term.dim() == 3:
            raise ValueError(
                f"attn_mask follows torch.nn: [T, S] or [B * H, T, S] = [{B * H}, {T}, {S}], "
                f"got {tuple(term.shape)}"
            )
        if name == "keep":
            torch_keep = validate_attention_mask(term, **sizes, name="attn_mask")
        else:
            torch_bias = validate_attention_bias(term, **sizes, dtype=dtype, name="attn_mask")
    keep = combine_masks(keep, attention_mask, torch_keep)
    if torch_bias is not None:
        bias = torch_bias if bias is None else bias + torch_bias
    return keep, bias


def refuse_key_padding_mask(key_padding_mask: Optional[Tensor]) -> None:
    """``key_padding_mask`` means padding in ``torch.nn`` and real tokens in old attnlab code."""
    if key_padding_mask is not None:
        raise TypeError(
            "key_padding_mask is not taken: torch.nn marks padding with True there, older attnlab "
            "marked real tokens, so either reading could be silently wrong. Pass "
            "attention_mask=[B, S] with True/1 on real tokens (HuggingFace's polarity; for a "
            "torch.nn padding mask that is ~key_padding_mask)"
        )


def _broadcasts(dim_size: int, target: int) -> bool:
    return dim_size == 1 or dim_size == target


def _to_rank4(
    mask: Tensor, batch: int, heads: int, query_len: int, key_len: int, name: str, padding_ok: bool = True
) -> Tensor:
    expected = f"a shape that broadcasts to [B, H, T, S] = [{batch}, {heads}, {query_len}, {key_len}]"
    if mask.dim() == 2:
        rows, keys = mask.shape
        fits_attention = _broadcasts(rows, query_len) and _broadcasts(keys, key_len)
        fits_padding = padding_ok and rows == batch and keys == key_len and rows > 1
        if fits_attention and fits_padding:
            raise ValueError(
                f"{name} of shape {tuple(mask.shape)} is ambiguous: batch size and query length are "
                f"both {batch}, so it could be a [B, S] padding mask or a [T, S] attention mask. "
                f"Pass a padding mask as attention_mask=, or the attention mask with its rank spelled "
                f"out ({name}[None] for [1, T, S])"
            )
        mask = mask[:, None, None, :] if fits_padding else mask[None, None]
    elif mask.dim() == 3:
        mask = mask[:, None]
    elif mask.dim() != 4:
        raise ValueError(
            f"{name} must have rank 2 [T, S] or [B, S], 3 [B, T, S] or 4 [B, H, T, S]; got rank "
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
