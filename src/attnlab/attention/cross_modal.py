"""Cross-modal attention between image patches and text tokens, with gated fusion.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` text length, ``S`` number of image
patches, ``E`` text width, ``V`` visual feature width.

Masks are padding masks ``[B, length]`` (or the article's ``[B, 1, 1, length]``), ``True``
/ 1 on real items (tokens or patches), i.e. the items that may be attended to, in any
dtype (:mod:`attnlab.attention.masks`).

The article's version of this block shares one attention module between the two
directions, hands each direction the mask of the wrong modality and crashes when it
concatenates ``[B, T, E]`` text with ``[B, 1, E]`` pooled vision. Here each direction
has its own parameters and takes the mask of the modality it attends *to*, and the
pooled visual context is broadcast to every text position before the gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from .._checks import check_inputs_match, check_positive_int, check_probability
from .._masked_mean import masked_mean
from .._precision import Linear
from ..outputs import ModelOutput
from .masks import keep_mask
from .multihead import MultiHeadAttention

__all__ = ["CrossModalAttention", "CrossModalOutput", "masked_mean"]

GATES = ("sigmoid", "tanh0")


@dataclass(frozen=True, eq=False)
class CrossModalOutput(ModelOutput):
    """What :class:`CrossModalAttention` returns.

    Unpacks like the article's ``(output, weights)``:
    ``output, weights = cma(visual, text)`` gives ``(output, text_to_visual_weights)``;
    ``out[0]``, ``out["gate"]`` and ``out.to_tuple()`` work as on every
    :class:`~attnlab.outputs.ModelOutput`.

    Attributes:
        output: fused text states ``[B, T, E]``.
        visual_output: vision states after attending to the text, at text width
            ``[B, S, E]`` (the input of a following cross-modal layer).
        text_to_visual_weights: ``[B, H, T, S]``, each text token's attention over the
            patches, when ``need_weights=True``; else ``None``.
        visual_to_text_weights: ``[B, H, S, T]``, each patch's attention over the text
            tokens, when ``need_weights=True``; else ``None``.
        gate: the fusion gate. ``gate="sigmoid"``: ``[B, T, E]``, the weight given to
            the text states (``1 - gate`` goes to the pooled visual context).
            ``gate="tanh0"``: a 0-d tensor, ``tanh(alpha)``, the weight of the visual
            update added to the text.
    """

    output: Tensor
    visual_output: Tensor
    text_to_visual_weights: Optional[Tensor]
    visual_to_text_weights: Optional[Tensor]
    gate: Tensor

    _tuple_fields = ("output", "text_to_visual_weights")


def _check_padding_mask(name: str, mask: Optional[Tensor], batch: int, length: int) -> Optional[Tensor]:
    """A ``[B, length]`` bool padding mask from ``[B, length]``, ``[B, 1, length]`` or
    ``[B, 1, 1, length]`` keep masks of any dtype."""
    if mask is None:
        return None
    mask = keep_mask(mask, name=name, bias_argument=None)
    if mask.dim() in (3, 4) and all(size == 1 for size in mask.shape[1:-1]):
        mask = mask.reshape(mask.shape[0], mask.shape[-1])  # the article's [B, 1, 1, length]
    if mask.shape != (batch, length):
        raise ValueError(
            f"{name} must be [B, length] = [{batch}, {length}] (or [B, 1, 1, length]), True/1 on real "
            f"items; got {tuple(mask.shape)}"
        )
    return mask


class CrossModalAttention(nn.Module):
    """Two-way cross-attention between image patches and text, fused into the text.

    Steps (``drop`` is residual dropout)::

        v      = visual_proj(visual)                              # [B, S, E]
        t2v    = attn_text_to_visual(q=text, k=v, v=v)            # keys masked by visual_mask
        v2t    = attn_visual_to_text(q=v, k=text, v=text)         # keys masked by text_mask
        v_out  = norm2(v + drop(v2t))                             # [B, S, E], for a next layer
        pooled = masked mean of v over real patches, broadcast to [B, T, E]

    ``gate="sigmoid"`` (the article's gated fusion, done right)::

        t_enh  = norm1(text + drop(t2v))
        g      = sigmoid(gate_proj([t_enh, pooled, t_enh * pooled]))  # [B, T, E]
        output = g * t_enh + (1 - g) * pooled

    ``gate="tanh0"`` (Flamingo-style: ``t2v`` then takes ``norm1(text)`` as its query)::

        output = text + tanh(alpha) * (t2v + pooled)              # alpha starts at 0

    so at initialisation the block returns its text input unchanged, which lets it be
    inserted into a trained text model without disturbing it.

    Args:
        visual_dim: width ``V`` of the visual features.
        text_dim: width ``E`` of the text states (the block's working width).
        num_heads: heads ``H`` of each direction's attention; must divide ``text_dim``.
        dropout: dropout on the residual branches (and on attention probabilities
            unless ``attention_dropout`` says otherwise).
        gate: ``"sigmoid"`` or ``"tanh0"``.
        attention_dropout: dropout on attention probabilities; ``None`` = ``dropout``.
            0 keeps torch's fused attention kernel in training.
        null_slot: give text tokens a learned "nothing here" slot to attend to besides
            the patches. How much a token attends to it then measures how little the
            image matches it, which lets a statement be checked against the image from
            the first steps of training; a sample without real patches attends to it
            alone. The returned text -> patch weights cover the patches only (rows sum
            to 1 minus the slot's share).

    Shape:
        ``visual_features`` ``[B, S, V]``, ``text_features`` ``[B, T, E]``,
        ``visual_mask`` ``[B, S]`` and ``text_mask`` ``[B, T]`` (or ``[B, 1, 1, S]`` /
        ``[B, 1, 1, T]``; ``True`` / 1 on real patches / tokens, any dtype; ``None`` = all real)
        -> :class:`CrossModalOutput`.
        A sample with no real patch gets zero visual context (never NaN).

    Example:
        >>> cma = CrossModalAttention(16, 32, 4, dropout=0.0)
        >>> out = cma(torch.randn(2, 9, 16), torch.randn(2, 5, 32), need_weights=True)
        >>> out.output.shape, out.text_to_visual_weights.shape, out.visual_to_text_weights.shape
        (torch.Size([2, 5, 32]), torch.Size([2, 4, 5, 9]), torch.Size([2, 4, 9, 5]))
        >>> output, weights = out  # the article's unpacking
    """

    def __init__(
        self,
        visual_dim: int,
        text_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        *,
        gate: str = "sigmoid",
        attention_dropout: Optional[float] = None,
        null_slot: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("visual_dim", visual_dim)
        check_positive_int("text_dim", text_dim)
        check_positive_int("num_heads", num_heads)
        dropout = check_probability("dropout", dropout)
        attention_dropout = dropout if attention_dropout is None else attention_dropout
        attention_dropout = check_probability("attention_dropout", attention_dropout)
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
        factory = {"device": device, "dtype": dtype}
        self.visual_dim = visual_dim
        self.text_dim = text_dim
        self.num_heads = num_heads
        self.gate_kind = gate
        self.visual_proj = Linear(visual_dim, text_dim, **factory)
        # One module per direction: the article reuses a single one for both.
        self.text_to_visual = MultiHeadAttention(text_dim, num_heads, attention_dropout, **factory)
        self.visual_to_text = MultiHeadAttention(text_dim, num_heads, attention_dropout, **factory)
        self.norm1 = nn.LayerNorm(text_dim, **factory)
        self.norm2 = nn.LayerNorm(text_dim, **factory)
        self.dropout = nn.Dropout(dropout)
        self.null_slot = nn.Parameter(torch.zeros(1, 1, text_dim, **factory)) if null_slot else None
        if gate == "sigmoid":
            self.gate_proj: Optional[Linear] = Linear(3 * text_dim, text_dim, **factory)
            self.register_parameter("gate_alpha", None)
        else:
            self.gate_proj = None
            self.gate_alpha = nn.Parameter(torch.zeros((), **factory))

    def _check_features(self, visual: Tensor, text: Tensor) -> None:
        for name, tensor, width in (
            ("visual_features", visual, self.visual_dim),
            ("text_features", text, self.text_dim),
        ):
            if not isinstance(tensor, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.dim() != 3 or tensor.shape[-1] != width:
                raise ValueError(f"{name} must be [B, length, {width}], got shape {tuple(tensor.shape)}")
        if visual.shape[0] != text.shape[0]:
            raise ValueError(
                f"visual_features and text_features must share the batch size; "
                f"got {visual.shape[0]} and {text.shape[0]}"
            )

    def forward(
        self,
        visual_features: Tensor,
        text_features: Tensor,
        visual_mask: Optional[Tensor] = None,
        text_mask: Optional[Tensor] = None,
        *,
        need_weights: bool = False,
    ) -> CrossModalOutput:
        """Fuse the image into the text; see the class docstring for shapes and masks."""
        self._check_features(visual_features, text_features)
        check_inputs_match(self, "CrossModalAttention", {"visual_features": visual_features,
                                                         "text_features": text_features})
        B, S, _ = visual_features.shape
        T = text_features.shape[1]
        visual_mask = _check_padding_mask("visual_mask", visual_mask, B, S)
        text_mask = _check_padding_mask("text_mask", text_mask, B, T)

        visual = self.visual_proj(visual_features)  # [B, S, E]
        text_query = self.norm1(text_features) if self.gate_kind == "tanh0" else text_features
        # Each direction masks the modality it attends to (its keys).
        keys, key_mask = visual, visual_mask
        if self.null_slot is not None:
            keys = torch.cat([self.null_slot.expand(B, 1, self.text_dim), visual], dim=1)  # [B, 1 + S, E]
            if visual_mask is not None:
                key_mask = torch.cat([visual_mask.new_ones(B, 1), visual_mask], dim=1)  # [B, 1 + S]
        t2v, t2v_weights = self.text_to_visual(
            text_query, keys, keys, attention_mask=key_mask, need_weights=need_weights
        )  # [B, T, E], [B, H, T, S (+ 1)] | None
        if t2v_weights is not None and self.null_slot is not None:
            t2v_weights = t2v_weights[..., 1:]  # [B, H, T, S]: the patches only
        v2t, v2t_weights = self.visual_to_text(
            visual, text_features, text_features, attention_mask=text_mask, need_weights=need_weights
        )  # [B, S, E], [B, H, S, T] | None
        visual_out = self.norm2(visual + self.dropout(v2t))  # [B, S, E]
        # The image's own context: pooling the vision->text states instead would mostly
        # hand the text back its own content and drown the image (training stalls).
        pooled = masked_mean(visual, visual_mask).expand(B, T, self.text_dim)  # [B, T, E]

        if self.gate_proj is not None:
            text_enhanced = self.norm1(text_features + self.dropout(t2v))  # [B, T, E]
            # The gate also sees the elementwise product of text and image: that lets a
            # statement be compared with the image from the first steps of training.
            features = torch.cat([text_enhanced, pooled, text_enhanced * pooled], dim=-1)  # [B, T, 3E]
            gate = torch.sigmoid(self.gate_proj(features))  # [B, T, E]
            output = gate * text_enhanced + (1.0 - gate) * pooled
        else:
            gate = torch.tanh(self.gate_alpha)  # 0-d
            output = text_features + gate * self.dropout(t2v + pooled)
        return CrossModalOutput(output, visual_out, t2v_weights, v2t_weights, gate)

    def extra_repr(self) -> str:
        return (
            f"visual_dim={self.visual_dim}, text_dim={self.text_dim}, "
            f"num_heads={self.num_heads}, gate={self.gate_kind!r}, null_slot={self.null_slot is not None}"
        )
