"""A small image–text classifier: patch encoder, text encoder, cross-modal fusion, head.

Dimension letters: ``B`` batch, ``T`` text length, ``S`` patches, ``P`` pixels per
patch, ``E`` text width, ``V`` visual width, ``H`` heads.

Two fusions share the encoders and the head, so they can be compared on equal terms:

* ``fusion="cross_attention"``: :class:`~attnlab.attention.CrossModalAttention` layers
  (each followed by a feed-forward block) fuse the patches into the text states; the
  head reads the ``[CLS]`` (first) text state, or the mean of the text states.
* ``fusion="concat"``: the baseline; the mean of the patch states and the pooled text
  states are concatenated and handed to the head, with no cross-attention.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_positive_int, check_probability, dataclass_from_dict
from .._precision import Linear
from .._pretrained_io import PretrainedIO
from ..attention.cross_modal import GATES, CrossModalAttention, masked_mean
from ..layers.encoder_layer import TransformerEncoderLayer
from .encoder import TransformerEncoder, model_config_part
from ..attention.masks import keep_mask
from ..layers.ffn import PositionWiseFFN
from ..outputs import LayerAttentions, ModelOutput

__all__ = ["ImageTextConfig", "ImageTextModel", "ImageTextOutput", "PatchEmbedding", "gate_summary"]

FUSIONS = ("cross_attention", "concat")
POOLINGS = ("first", "mean")


@dataclass
class ImageTextConfig:
    """Everything needed to rebuild an :class:`ImageTextModel`."""

    vocab_size: int
    image_size: int = 8  # side of the square grey-scale image
    patch_size: int = 2  # 2 -> 16 patches of an 8x8 digit: fine enough to see strokes
    visual_dim: int = 64
    visual_layers: int = 1  # 8x8 digits need little depth; the text-image interaction is the hard part
    d_model: int = 64  # text width, and the width the fusion works at
    text_layers: int = 2
    num_heads: int = 4
    d_ff: int = 128
    cross_layers: int = 1  # a second layer slowed learning on the digits task
    dropout: float = 0.1
    # 0 keeps the fused attention kernel in training; dropout on probabilities costs
    # more time than it buys on this small task.
    attention_dropout: float = 0.0
    max_len: int = 32
    pad_id: int = 0
    num_labels: int = 2
    gate: str = "sigmoid"
    fusion: str = "cross_attention"
    pooling: str = "mean"  # what the head reads: the mean of real tokens, or the [CLS] state ("first")
    null_slot: bool = False  # a "nothing here" slot for text -> patch attention (see CrossModalAttention)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "image_size", "patch_size", "visual_dim", "visual_layers", "d_model",
                     "text_layers", "num_heads", "d_ff", "max_len", "num_labels"):
            check_positive_int(name, getattr(self, name))
        if not isinstance(self.cross_layers, int) or self.cross_layers < 0:
            raise ValueError(f"cross_layers must be an int >= 0, got {self.cross_layers!r}")
        check_probability("dropout", self.dropout)
        check_probability("attention_dropout", self.attention_dropout)
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size={self.patch_size} must divide image_size={self.image_size}"
            )
        for name in ("visual_dim", "d_model"):
            if getattr(self, name) % self.num_heads:
                raise ValueError(f"{name}={getattr(self, name)} is not divisible by num_heads={self.num_heads}")
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {self.gate!r}")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS}, got {self.fusion!r}")
        if self.fusion == "cross_attention" and self.cross_layers == 0:
            raise ValueError("fusion='cross_attention' needs cross_layers >= 1")

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ImageTextConfig":
        return dataclass_from_dict(cls, values)


@dataclass(eq=False)
class ImageTextOutput(ModelOutput):
    """What :class:`ImageTextModel` returns (a :class:`~attnlab.outputs.ModelOutput`:
    ``out[0]`` is the loss when labels were given, else the logits).

    Attributes:
        loss: mean cross-entropy when ``labels`` were given, else ``None``.
        logits: ``[B, num_labels]``.
        attentions: text self-attention, a :class:`~attnlab.outputs.LayerAttentions` of
            ``[B, H, T, T]`` (``attentions[0]`` = ``attentions["layer_1"]``) when
            ``output_attentions=True``, else ``None``.
        visual_attentions: patch self-attention ``[B, H, S, S]`` per layer, or ``None``.
        cross_attentions: text-token -> patch attention ``[B, H, T, S]`` per cross-modal
            layer, or ``None`` (also ``None`` for the ``concat`` baseline).
        visual_to_text_attentions: patch -> text-token attention ``[B, H, S, T]`` per
            cross-modal layer, or ``None``.
        gates: each cross-modal layer's gate (see :class:`CrossModalOutput`), by layer
            name; empty for the baseline.
    """

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    attentions: Optional[LayerAttentions] = None
    visual_attentions: Optional[LayerAttentions] = None
    cross_attentions: Optional[LayerAttentions] = None
    visual_to_text_attentions: Optional[LayerAttentions] = None
    gates: dict[str, Tensor] = field(default_factory=dict)


class PatchEmbedding(nn.Module):
    """Cut a grey-scale image into square patches, embed each, add 2-D positions.

    Pixels are expected in ``[0, 1]`` (ink high) and are centred to ``[-1, 1]`` before
    the patch projection.

    The position of patch ``(row, col)`` is ``row_embedding[row] + col_embedding[col]``.

    Shape:
        ``images`` ``[B, image_size, image_size]`` -> ``[B, S, V]`` with
        ``S = (image_size / patch_size) ** 2``, patches in row-major order.
    """

    def __init__(self, image_size: int, patch_size: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.image_size = image_size
        self.patch_size = patch_size
        self.grid_size = image_size // patch_size
        self.proj = Linear(patch_size * patch_size, dim, **factory)
        # No constant offset shared by every patch of every image: at initialisation the
        # patch states then differ between images instead of mostly repeating the bias,
        # which is what lets text and image interact from the first steps.
        nn.init.zeros_(self.proj.bias)
        self.row_embedding = nn.Parameter(torch.randn(self.grid_size, dim, **factory) * 0.02)
        self.col_embedding = nn.Parameter(torch.randn(self.grid_size, dim, **factory) * 0.02)

    def patches(self, images: Tensor) -> Tensor:
        """``[B, image_size, image_size]`` -> ``[B, S, P]`` raw pixel patches, row-major."""
        B = images.shape[0]
        G, p = self.grid_size, self.patch_size
        x = images.reshape(B, G, p, G, p)  # [B, row, y, col, x]
        return x.permute(0, 1, 3, 2, 4).reshape(B, G * G, p * p)  # [B, S, P]

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 3 or images.shape[1:] != (self.image_size, self.image_size):
            raise ValueError(
                f"images must be [B, {self.image_size}, {self.image_size}], got shape {tuple(images.shape)}"
            )
        x = self.proj(self.patches(images) * 2.0 - 1.0)  # [B, S, V]; pixels centred: ink +1, paper -1
        position = (self.row_embedding[:, None, :] + self.col_embedding[None, :, :]).flatten(0, 1)  # [S, V]
        return x + position


class _CrossModalLayer(nn.Module):
    """Cross-modal attention, then a feed-forward block on the fused text (post-norm)."""

    def __init__(self, visual_dim: int, config: ImageTextConfig, factory: dict) -> None:
        super().__init__()
        self.cross = CrossModalAttention(
            visual_dim, config.d_model, config.num_heads, config.dropout, gate=config.gate,
            attention_dropout=config.attention_dropout, null_slot=config.null_slot, **factory,
        )
        self.ffn = PositionWiseFFN(config.d_model, config.d_ff, config.dropout, **factory)
        self.norm = nn.LayerNorm(config.d_model, **factory)

    def forward(self, visual: Tensor, text: Tensor, visual_mask: Optional[Tensor], text_mask: Tensor,
                need_weights: bool):
        fused = self.cross(visual, text, visual_mask, text_mask, need_weights=need_weights)
        return self.norm(fused.output + self.ffn(fused.output)), fused


class _ClassificationHead(nn.Module):
    def __init__(self, in_dim: int, hidden: int, num_labels: int, dropout: float, factory: dict) -> None:
        super().__init__()
        self.dense = Linear(in_dim, hidden, **factory)
        self.dropout = nn.Dropout(dropout)
        self.out = Linear(hidden, num_labels, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(x)))))


class ImageTextModel(PretrainedIO, nn.Module):
    """Classify an (image, statement) pair, e.g. "is this statement true of the image?".

    Args:
        config: the model's :class:`ImageTextConfig`.

    Shape:
        ``input_ids`` ``[B, T]`` with ``[CLS]`` first; ``mask`` ``[B, T]`` (``True`` on
        real tokens; derived from ``pad_id`` when omitted); ``images``
        ``[B, image_size, image_size]``; ``image_mask`` ``[B, S]`` (``True`` on real
        patches; ``None`` = all) -> :class:`ImageTextOutput` with ``logits [B, num_labels]``.

    Example:
        >>> model = ImageTextModel(ImageTextConfig(vocab_size=30))
        >>> out = model(torch.tensor([[2, 5, 6]]), images=torch.rand(1, 8, 8), output_attentions=True)
        >>> out.logits.shape, out.cross_attentions["layer_1"].shape
        (torch.Size([1, 2]), torch.Size([1, 4, 3, 16]))
    """

    model_type = "image_text"

    def __init__(self, config: ImageTextConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        if not isinstance(config, ImageTextConfig):
            raise TypeError(f"config must be an ImageTextConfig, got {type(config).__name__}")
        self.config = config
        factory = {"device": device, "dtype": dtype}
        self.patch_embedding = PatchEmbedding(config.image_size, config.patch_size, config.visual_dim, **factory)
        self.visual_dropout = nn.Dropout(config.dropout)
        self.visual_layers = nn.ModuleList(
            TransformerEncoderLayer(
                config.visual_dim, config.num_heads, config.visual_dim * 2, config.dropout, norm_first=True,
                attention_dropout=config.attention_dropout, **factory,
            )
            for _ in range(config.visual_layers)
        )
        self.visual_norm = nn.LayerNorm(config.visual_dim, **factory)
        self.text_encoder = TransformerEncoder(
            config.vocab_size, config.d_model, config.text_layers, config.num_heads, config.d_ff,
            config.dropout, config.max_len, pad_id=config.pad_id, norm_first=True,
            attention_dropout=config.attention_dropout, **factory,
        )
        if config.fusion == "cross_attention":
            self.cross_layers = nn.ModuleList(
                _CrossModalLayer(config.visual_dim if index == 0 else config.d_model, config, factory)
                for index in range(config.cross_layers)
            )
            head_in = config.d_model
        else:
            self.cross_layers = nn.ModuleList()
            head_in = config.visual_dim + config.d_model
        self.head = _ClassificationHead(head_in, config.d_model, config.num_labels, config.dropout, factory)

    def _pool(self, text: Tensor, text_mask: Tensor) -> Tensor:
        if self.config.pooling == "first":
            return text[:, 0]  # [B, E], the [CLS] state
        return masked_mean(text, text_mask).squeeze(1)  # [B, E]

    @property
    def encoder(self) -> TransformerEncoder:
        """The text encoder (its config goes to ``config.json`` as ``"encoder"``)."""
        return self.text_encoder

    def head_config(self) -> dict[str, Any]:
        """The whole :class:`ImageTextConfig`, saved as ``config.json``'s ``"head"``."""
        return self.config.to_dict()

    @classmethod
    def from_config(
        cls, config: Union[ImageTextConfig, dict[str, Any]], *, device=None, dtype=None
    ) -> "ImageTextModel":
        """A fresh model from an :class:`ImageTextConfig`, its dict, or the ``config.json``
        dict :func:`attnlab.checkpoints.save_model` writes (its ``"head"`` entry)."""
        return cls(model_config_part(config, ImageTextConfig, "head", cls.__name__), device=device, dtype=dtype)

    @classmethod
    def from_model_config(cls, config: dict[str, Any], *, device=None, dtype=None) -> "ImageTextModel":
        """The old name of :meth:`from_config`."""
        return cls.from_config(config, device=device, dtype=dtype)

    def encode_image(
        self, images: Tensor, image_mask: Optional[Tensor] = None, *, output_attentions: bool = False
    ) -> tuple[Tensor, Optional[dict[str, Tensor]]]:
        """Patch states ``[B, S, V]`` and, when asked, per-layer patch self-attention."""
        x = self.visual_dropout(self.patch_embedding(images))  # [B, S, V]
        attention_mask = None if image_mask is None else image_mask.bool()[:, None, None, :]  # [B, 1, 1, S]
        attentions: list[Optional[Tensor]] = []
        for layer in self.visual_layers:
            x, weights = layer(x, attention_mask, need_weights=output_attentions)
            attentions.append(weights)
        return self.visual_norm(x), LayerAttentions(attentions) if output_attentions else None

    def forward(
        self,
        input_ids: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        images: Tensor,
        image_mask: Optional[Tensor] = None,
        image_index: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
        output_attentions: bool = False,
        head_mask: Optional[Tensor] = None,
    ) -> ImageTextOutput:
        """Score ``(image, statement)`` pairs.

        Args:
            input_ids: ``[B, T]`` statement ids, ``[CLS]`` first.
            mask: ``[B, T]``, ``True`` / 1 on real tokens (any dtype); derived from
                ``pad_id`` when omitted.
            attention_mask: HuggingFace's name for ``mask``; give one of them.
            images: ``[N, image_size, image_size]``; ``N == B`` unless ``image_index`` is given.
            image_mask: ``[N, S]``, ``True`` on real patches; ``None`` = all real.
            image_index: ``[B]`` row of ``images`` that each statement is about, so that
                several statements about one image share a single image encoding.
            labels: ``[B]`` class ids; when given, ``loss`` is their mean cross-entropy.
            output_attentions: also return every attention map (see :class:`ImageTextOutput`).
            head_mask: ``[H]`` or ``[L, H]`` multipliers of the text encoder's heads.
        """
        B, T = input_ids.shape
        N = images.shape[0]
        if image_index is None:
            if N != B:
                raise ValueError(
                    f"images must have batch size {B} like input_ids (or pass image_index), "
                    f"got shape {tuple(images.shape)}"
                )
        elif image_index.shape != (B,) or (B and (int(image_index.min()) < 0 or int(image_index.max()) >= N)):
            raise ValueError(f"image_index must be [B] = [{B}] with values in [0, {N}), got {image_index.tolist()}")
        if image_mask is not None and image_mask.shape != (N, self.config.num_patches):
            raise ValueError(
                f"image_mask must be [N, S] = [{N}, {self.config.num_patches}], got {tuple(image_mask.shape)}"
            )
        text_mask = self.text_encoder.padding_mask_for(input_ids, mask, attention_mask)  # [B, T]
        if text_mask is None or text_mask.dim() != 2:
            text_mask = (
                input_ids != self.config.pad_id if text_mask is None else keep_mask(text_mask, name="mask")
            )
        if image_mask is not None:
            image_mask = keep_mask(image_mask, name="image_mask", bias_argument=None)
        visual, visual_attentions = self.encode_image(images, image_mask, output_attentions=output_attentions)
        if image_index is not None:
            visual = visual[image_index]  # [B, S, V]
            image_mask = None if image_mask is None else image_mask[image_index]  # [B, S]
            if visual_attentions is not None:
                visual_attentions = LayerAttentions(value[image_index] for value in visual_attentions)
        text, attentions = self.text_encoder(
            input_ids, text_mask, output_attentions=output_attentions, head_mask=head_mask
        )  # [B, T, E]
        cross: list[Optional[Tensor]] = []
        backward: list[Optional[Tensor]] = []
        gates: dict[str, Tensor] = {}
        if self.config.fusion == "concat":
            image_summary = masked_mean(visual, image_mask).squeeze(1)  # [B, V]
            pooled = torch.cat([image_summary, self._pool(text, text_mask)], dim=-1)  # [B, V + E]
            logits = self.head(pooled)  # [B, num_labels]
            loss = _loss(logits, labels)
            return ImageTextOutput(loss, logits, attentions, visual_attentions, None, None, gates)
        for index, layer in enumerate(self.cross_layers):
            text, fused = layer(visual, text, image_mask, text_mask, output_attentions)
            visual = fused.visual_output  # [B, S, E]: the next layer's visual input
            name = f"layer_{index + 1}"
            gates[name] = fused.gate
            cross.append(fused.text_to_visual_weights)
            backward.append(fused.visual_to_text_weights)
        logits = self.head(self._pool(text, text_mask))  # [B, num_labels]
        if not output_attentions:
            loss = _loss(logits, labels)
            return ImageTextOutput(loss, logits, attentions, visual_attentions, None, None, gates)
        return ImageTextOutput(
            _loss(logits, labels), logits, attentions, visual_attentions,
            LayerAttentions(cross), LayerAttentions(backward), gates,
        )


def _loss(logits: Tensor, labels: Optional[Tensor]) -> Optional[Tensor]:
    return None if labels is None else F.cross_entropy(logits.float(), labels)


def gate_summary(gates: dict[str, Tensor]) -> dict[str, float]:
    """One number per cross-modal layer: the mean gate value (for logging)."""
    return {f"gate/{name}": float(value.detach().float().mean()) for name, value in gates.items()}
