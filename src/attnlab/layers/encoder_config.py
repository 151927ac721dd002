"""The encoder's configuration: one validated, serialisable dataclass."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from .._checks import check_positive_int, check_probability, dataclass_from_dict

__all__ = ["EncoderConfig"]

POSITIONS = ("sinusoidal", "learned", "rotary", "none")
ATTENTIONS = ("dense", "sparse")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")


@dataclass
class EncoderConfig:
    """Everything needed to rebuild a :class:`~attnlab.TransformerEncoder`.

    The first seven fields are the article's constructor arguments, with its defaults.
    One default differs from the article: ``attention_dropout`` is 0, not ``dropout``
    (attention-probability dropout disables the fused attention kernel in training and
    costs time and ``T^2`` memory; see the design notes). ``attention_dropout=None``
    gives the article's behaviour.
    """

    vocab_size: int
    d_model: int = 512
    num_layers: int = 6
    num_heads: int = 8
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 5000
    # Dropout on attention probabilities. 0 by default: any value above 0 makes torch
    # leave its fused (flash) attention kernel in training for a path that builds the
    # [B, H, T, T] matrix, slower and with T^2 memory; `dropout` still regularises the
    # embeddings, residual branches and feed-forward net. None = same as `dropout`
    # (the article's and BERT's behaviour).
    attention_dropout: Optional[float] = 0.0
    pad_id: Optional[int] = None  # when set, padding masks are derived from input ids
    norm_first: bool = False  # False: post-norm, as in the article and BERT
    activation: str = "gelu"
    layer_norm_eps: float = 1e-5
    position: str = "sinusoidal"  # "sinusoidal" | "learned" | "rotary" | "none"
    type_vocab_size: int = 0  # > 0 adds BERT-style token-type (segment) embeddings
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model), as the article
    embedding_norm: bool = False  # LayerNorm after the embeddings (BERT)
    final_norm: bool = True  # LayerNorm after the last layer (the article)
    bias: bool = True
    # "dense": MultiHeadAttention. "sparse": SparseAttention, O(T * block) for long inputs;
    # the four fields below configure it and must keep their defaults with "dense".
    attention: str = "dense"
    block_size: int = 32  # positions per block (the article's default)
    window: int = 0  # neighbouring blocks attended on each side; 0 = own block only
    global_summary: bool = True  # the article's pooled global context, added to every position
    global_tokens: tuple[int, ...] = ()  # positions that attend to all and are attended by all
    # With a [B, T] padding mask and dense attention, run the projections, feed-forward
    # nets and LayerNorms on the real tokens only, and attention over each sequence's
    # real tokens (see attention/packing.py). Real tokens get the same values either
    # way; padding positions come out as zeros and the attention weights of padding
    # queries are zero. False computes every position, as HuggingFace BERT does (same
    # numbers at padding too, slower).
    skip_padding: bool = True
    # Heads removed by attnlab.models.prune_heads, {"layer_2": [0, 3]} (0-based heads of
    # the unpruned layer); the encoder is built with them removed, so a pruned model loads.
    pruned_heads: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "max_len"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}"
            )
        check_probability("dropout", self.dropout)
        if self.attention_dropout is not None:
            check_probability("attention_dropout", self.attention_dropout)
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id={self.pad_id} must lie in [0, vocab_size={self.vocab_size})")
        if self.position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS}, got {self.position!r}")
        if self.position == "rotary" and (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"position='rotary' needs an even head dim, got d_model/num_heads = "
                f"{self.d_model}/{self.num_heads} = {self.d_model // self.num_heads}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        self._check_sparse_options()
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")
        if not isinstance(self.skip_padding, bool):
            raise ValueError(f"skip_padding must be True or False, got {self.skip_padding!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}")
        self._check_pruned_heads()

    def _check_pruned_heads(self) -> None:
        heads = self.pruned_heads
        if not isinstance(heads, dict):
            raise ValueError(f"pruned_heads must be a dict like {{'layer_2': [0, 3]}}, got {heads!r}")
        layers = {f"layer_{index + 1}" for index in range(self.num_layers)}
        for name, removed in heads.items():
            if name not in layers:
                raise ValueError(
                    f"pruned_heads names layer {name!r}; the encoder has layer_1..layer_{self.num_layers}"
                )
            if any(not isinstance(h, int) or isinstance(h, bool) or not 0 <= h < self.num_heads for h in removed):
                raise ValueError(
                    f"pruned_heads[{name!r}] must hold heads in 0..{self.num_heads - 1}, got {removed!r}"
                )
            if len(set(removed)) == self.num_heads:
                raise ValueError(
                    f"pruned_heads[{name!r}] removes all {self.num_heads} heads; keep at least one"
                )
            if self.attention != "dense":
                raise ValueError("pruned_heads applies to dense attention only")
        self.pruned_heads = {name: sorted(set(removed)) for name, removed in heads.items()}

    def _check_sparse_options(self) -> None:
        check_positive_int("block_size", self.block_size)
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 0:
            raise ValueError(f"window must be an int >= 0 (blocks on each side), got {self.window!r}")
        if isinstance(self.global_tokens, (str, bytes)) or not hasattr(self.global_tokens, "__iter__"):
            raise ValueError(f"global_tokens must be a sequence of positions, got {self.global_tokens!r}")
        self.global_tokens = tuple(self.global_tokens)  # a list after a JSON round trip
        if any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in self.global_tokens):
            raise ValueError(f"global_tokens must hold non-negative int positions, got {self.global_tokens!r}")
        if self.attention != "sparse":
            changed = [
                name
                for name, default in (("block_size", 32), ("window", 0), ("global_summary", True), ("global_tokens", ()))
                if getattr(self, name) != default
            ]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} only apply to attention='sparse', but attention={self.attention!r}"
                )

    @property
    def effective_attention_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else self.attention_dropout

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "EncoderConfig":
        return dataclass_from_dict(cls, values)
