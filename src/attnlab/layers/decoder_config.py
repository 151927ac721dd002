"""A decoder's configuration: one validated, serialisable dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .._checks import check_positive_int, dataclass_from_dict
from ..attention.rotary import rotary_inverse_frequencies

__all__ = ["DecoderConfig"]

NORMS = ("rms", "layer")
FEED_FORWARDS = ("gated", "plain")
POSITIONS = ("rotary", "learned")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")


@dataclass
class DecoderConfig:
    """Everything needed to rebuild a :class:`~attnlab.models.decoder.DecoderForCausalLM`.

    The defaults describe a Llama-style block (RMSNorm, SwiGLU, rotary, no biases); GPT-2
    is ``norm="layer", feed_forward="plain", activation="gelu_tanh", position="learned"``
    with biases.
    """

    vocab_size: int
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072
    num_kv_heads: Optional[int] = None  # grouped-query attention; None = num_heads
    head_dim: Optional[int] = None  # None = d_model // num_heads
    max_len: int = 2048  # context length (learned positions: the table's size)
    norm: str = "rms"  # "rms" (Llama) | "layer" (GPT-2); pre-norm, plus one after the last layer
    norm_eps: float = 1e-6
    feed_forward: str = "gated"  # "gated" (SwiGLU) | "plain" (Linear -> activation -> Linear)
    activation: str = "silu"
    position: str = "rotary"  # "rotary" | "learned"
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict[str, Any]] = None  # HuggingFace's form: {"rope_type": "llama3", ...}
    qkv_bias: bool = False  # Qwen2 and GPT-2: True
    out_bias: bool = False  # GPT-2: True
    ffn_bias: bool = False  # GPT-2: True
    sliding_window: Optional[int] = None  # Mistral: each query sees its last `sliding_window` keys
    scale_by_layer: bool = False  # GPT-2's scale_attn_by_inverse_layer_idx
    tie_embeddings: bool = True  # the LM head shares the token embedding
    pad_id: Optional[int] = None
    bos_id: Optional[int] = None
    eos_id: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
            check_positive_int(name, getattr(self, name))
        if self.num_kv_heads is not None:
            check_positive_int("num_kv_heads", self.num_kv_heads)
            if self.num_heads % self.num_kv_heads:
                raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; set head_dim")
        for name, value, choices in (("norm", self.norm, NORMS), ("feed_forward", self.feed_forward, FEED_FORWARDS),
                                     ("position", self.position, POSITIONS),
                                     ("activation", self.activation, ACTIVATIONS)):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        if self.sliding_window is not None:
            check_positive_int("sliding_window", self.sliding_window)
        if self.position == "rotary":  # fails early on an odd head dim or an unknown scaling
            rotary_inverse_frequencies(self.attention_head_dim, self.rope_theta, self.rope_scaling,
                                       max_len=self.max_len)
        # Ids past the vocabulary are accepted, as transformers accepts them (a small GPT-2 config
        # keeps GPT-2's bos/eos 50256); generation says so when it would use one.
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a token id (an int >= 0) or None, got {value!r}")

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DecoderConfig":
        return dataclass_from_dict(cls, values)
