"""Rotary position embedding at given positions, with the frequency scalings checkpoints carry.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head dim.

:class:`~attnlab.attention.rotary.RotaryEmbedding` rotates one run of positions
``offset, offset + 1, ...``. A decoder needs positions per sequence (a left-padded row
starts counting at its first real token, a cached step continues where its row stopped)
and the frequency scalings of long-context checkpoints, so :class:`ScaledRotary` takes a
``[B, T]`` tensor of positions and a ``rope_scaling`` dict in HuggingFace's form.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .._checks import check_positive_int

__all__ = ["ROPE_TYPES", "ScaledRotary", "apply_rotary", "rotary_inverse_frequencies", "rotary_parameters"]

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
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    interpolated = inv_freq / factor
    return interpolated * (1 - extrapolation) + inv_freq * extrapolation, float(attention_factor)


def rotary_parameters(
    head_dim: int, theta: float = 10000.0, scaling: Optional[dict[str, Any]] = None, *, max_len: int = 2048
) -> tuple[Tensor, float]:
    """The ``[D/2]`` rotation frequencies ``theta^(-2i/D)``, scaled as ``scaling`` says, and
    the factor that multiplies cos and sin (1 except for YaRN).

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

    Raises:
        ValueError: an odd ``head_dim``, or a scaling type other than :data:`ROPE_TYPES`.
    """
    check_positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
    # The same float32 arithmetic as HuggingFace, so frequencies match bit for bit.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    scaling = dict(scaling or {})
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
        angles = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)  # [B, T, D/2]
        angles = torch.cat((angles, angles), dim=-1)  # [B, T, D]
        if self.attention_scaling != 1.0:
            return (angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by the angles whose ``cos``/``sin`` are ``[B, T, D]``
    ("rotate half" layout: pairs ``(i, i + D/2)``)."""
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, D]
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)  # [B, H, T, D]
    return x * cos + rotated * sin
