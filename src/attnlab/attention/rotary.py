"""Rotary position embedding (RoPE, Su et al. 2021): the one implementation.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head dim.

* :class:`RotaryEmbedding`, an option of the encoder's attention modules, rotates one run
  of positions ``offset, offset + 1, ...`` (or given positions of a packed batch).
* :class:`ScaledRotary` gives a decoder the cosines and sines at a ``[B, T]`` tensor of
  positions (a left-padded row starts counting at its first real token, a cached step
  continues where its row stopped), and :func:`apply_rotary` rotates by them.

Both take their frequencies from :func:`rotary_parameters` (one formula, with the
``rope_scaling`` of long-context checkpoints), their angles from :func:`rotary_angles`, and
rotate with the same "rotate half" step (pairs ``(i, i + D/2)``, as GPT-NeoX and Llama).
The only difference is the arithmetic of the frequencies: a decoder opened from a
checkpoint computes them in float32 as HuggingFace does (they match bit for bit); the
encoders' rotary option in float64, rounded once to float32 (the float32 nearest to
``theta^(-2i/D)``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .._checks import check_positive_int

__all__ = ["ROPE_TYPES", "RotaryEmbedding", "ScaledRotary", "apply_rotary", "rotary_angles",
           "rotary_inverse_frequencies", "rotary_parameters"]

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _scaling_value(scaling: dict[str, Any], key: str, rope_type: str) -> float:
    if key not in scaling:
        raise ValueError(f"rope_scaling of type {rope_type!r} needs {key!r}; got keys {sorted(scaling)}")
    return float(scaling[key])


def rotary_inverse_frequencies(
    head_dim: int, theta: float = 10000.0, scaling: Optional[dict[str, Any]] = None, *, max_len: int = 2048
) -> Tensor:
    """The ``[D/2]`` rotation frequencies ``theta^(-2i/D)``, scaled as ``scaling`` says
    (see :func:`rotary_parameters`)."""
    return rotary_parameters(head_dim, theta, scaling, max_len=max_len)[0]


def _yarn(inv_freq: Tensor, head_dim: int, theta: float, scaling: dict[str, Any], max_len: int) -> tuple[Tensor, float]:
    """YaRN (Peng et al. 2023): interpolate long wavelengths, keep short ones, ramp between;
    scale cos and sin by ``attention_factor``. HuggingFace's arithmetic."""
    old_len = float(scaling.get("original_max_position_embeddings", max_len))
    factor = scaling.get("factor")
    factor = max_len / old_len if factor is None else float(factor)

    def mscale(scale: float, weight: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(head_dim // 2, dtype=inv_freq.dtype) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    interpolated = inv_freq / factor
    return interpolated * (1 - extrapolation) + inv_freq * extrapolation, float(attention_factor)


def rotary_parameters(
    head_dim: int,
    theta: float = 10000.0,
    scaling: Optional[dict[str, Any]] = None,
    *,
    max_len: int = 2048,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, float]:
    """The ``[D/2]`` rotation frequencies ``theta^(-2i/D)`` (float32), scaled as ``scaling``
    says, and the factor that multiplies cos and sin (1 except for YaRN).

    Args:
        head_dim: ``D``; must be even.
        theta: frequency base (``rope_theta``).
        scaling: ``None`` or HuggingFace's ``rope_scaling`` / ``rope_parameters`` dict:
            ``{"rope_type": "linear", "factor": f}`` divides every frequency by ``f``;
            ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings"}`` divides long wavelengths by ``factor``,
            keeps short ones and interpolates between (Llama 3.1);
            ``{"rope_type": "yarn", "factor", "original_max_position_embeddings", ...}``
            (YaRN, as Qwen2.5's long-context configurations carry).
        max_len: the model's context length, the default ``original_max_position_embeddings``.
        dtype: the arithmetic: ``torch.float32`` is HuggingFace's (a checkpoint's frequencies
            bit for bit); ``torch.float64`` rounds the result to float32 once (nearest).

    Raises:
        ValueError: an odd ``head_dim``, or a scaling type other than :data:`ROPE_TYPES`.
    """
    check_positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    # HuggingFace's formula; in float32 its frequencies match theirs bit for bit.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype) / head_dim))
    inv_freq, factor = _scaled(inv_freq, head_dim, theta, dict(scaling or {}), max_len)
    return inv_freq.float(), factor


def _scaled(
    inv_freq: Tensor, head_dim: int, theta: float, scaling: dict[str, Any], max_len: int
) -> tuple[Tensor, float]:
    """``inv_freq`` scaled as a ``rope_scaling`` dict says (see :func:`rotary_parameters`)."""
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / _scaling_value(scaling, "factor", rope_type), 1.0
    if rope_type == "llama3":
        factor = _scaling_value(scaling, "factor", rope_type)
        low = _scaling_value(scaling, "low_freq_factor", rope_type)
        high = _scaling_value(scaling, "high_freq_factor", rope_type)
        old_len = float(scaling.get("original_max_position_embeddings", max_len))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if rope_type == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling, max_len)
    raise ValueError(
        f"rope_scaling type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
    )


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, Su et al. 2021) applied to queries and keys.

    Rotates pairs ``(x[..., i], x[..., i + D/2])`` by an angle ``position * base^(-2i/D)``
    (the "rotate half" layout used by GPT-NeoX and LLaMA). It is relative: the dot
    product of a rotated query and key depends only on their distance.

    Args:
        head_dim: ``D``; must be even.
        base: frequency base.

    Shape:
        ``x``: ``[B, H, T, D]`` -> ``[B, H, T, D]``.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, *, device=None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.base = base
        check_positive_int("head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        # in float64, rounded once: no checkpoint's float32 frequencies to match here
        inv_freq, _ = rotary_parameters(head_dim, base, dtype=torch.float64)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)  # [D/2]

    def _cos_sin(self, length: int, offset: int, device, dtype) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` ``[T, D]`` of positions ``offset .. offset + T - 1``, cut
        from a float32 table that grows to the longest run seen (built once, not per call:
        a packed batch rotates all its sequences with one lookup)."""
        cos, sin = self._table(offset + length, device)
        return cos[offset:offset + length].to(dtype), sin[offset:offset + length].to(dtype)

    def _table(self, length: int, device) -> tuple[Tensor, Tensor]:
        cached = getattr(self, "_cached", None)
        usable = (
            cached is not None
            and cached[0].shape[0] >= length
            and cached[0].device == torch.device(device)
            # a table made under inference_mode cannot be saved for a backward pass
            and (torch.is_inference_mode_enabled() or not cached[0].is_inference())
        )
        if not usable:
            rows = max(length, 2 * cached[0].shape[0] if cached is not None else 64)
            angles = rotary_angles(torch.arange(rows, device=device), self.inv_freq.to(device))  # [T, D]
            self._cached = (angles.cos(), angles.sin())
        return self._cached

    def rotate_positions(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate rows at given positions: ``x`` ``[N, H, D]``, ``positions`` ``[N]`` ints.

        The packed layout's rotation (each real token at its place in its own sequence).
        """
        if x.dim() != 3 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [N, H, {self.head_dim}], got shape {tuple(x.shape)}")
        length = int(positions.max()) + 1 if positions.numel() else 0
        cos, sin = self._table(length, x.device)
        cos, sin = cos[positions].to(x.dtype)[:, None], sin[positions].to(x.dtype)[:, None]  # [N, 1, D]
        return _rotate(x, cos, sin)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must be [B, H, T, {self.head_dim}], got shape {tuple(x.shape)}")
        cos, sin = self._cos_sin(x.shape[2], offset, x.device, x.dtype)  # [T, D]
        return _rotate(x, cos, sin)


class ScaledRotary(nn.Module):
    """Cosines and sines of rotary angles at per-sequence positions.

    Args:
        head_dim: ``D``; must be even.
        theta: frequency base.
        scaling: HuggingFace's ``rope_scaling`` dict or ``None`` (see
            :func:`rotary_inverse_frequencies`).
        max_len: the model's context length.

    Shape:
        ``position_ids`` ``[B, T]`` (int) -> ``(cos, sin)``, each ``[B, T, D]`` in ``dtype``.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        scaling: Optional[dict[str, Any]] = None,
        *,
        max_len: int = 2048,
        device=None,
    ) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rotary_parameters(head_dim, theta, scaling, max_len=max_len)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)  # [D/2]
        self.head_dim = head_dim

    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        angles = rotary_angles(position_ids, self.inv_freq.to(position_ids.device))  # [B, T, D]
        if self.attention_scaling != 1.0:
            return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def rotary_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """The angles ``position * inv_freq`` in float32, each frequency twice (the "rotate
    half" layout): ``positions`` ``[...]`` -> ``[..., D]``."""
    angles = positions[..., None].float() * inv_freq  # [..., D/2]
    return torch.cat((angles, angles), dim=-1)  # [..., D]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by the angles whose ``cos``/``sin`` are ``[B, T, D]``
    ("rotate half" layout: pairs ``(i, i + D/2)``)."""
    return _rotate(x, cos[:, None], sin[:, None])  # cos, sin [B, 1, T, D]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin``; ``cos`` and ``sin`` broadcast against ``x``."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    return x * cos + rotated * sin
