"""The Transformer encoder: token embedding, positions, a stack of
:class:`~attnlab.layers.encoder_layer.TransformerEncoderLayer` and a final norm; the
encoder-side twin of :mod:`attnlab.models.decoder`. Its components live in
:mod:`attnlab.layers` and :mod:`attnlab.attention`.

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``H`` heads, ``L`` layers.
Masks follow :mod:`attnlab.attention.masks`: ``True`` / 1 = may attend, in any dtype; a
``[B, T]`` mask given to the encoder marks real tokens (``True``) and padding (``False``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from torch import Tensor, nn

from .._checks import check_inputs_match, check_positive_int
from .._precision import Linear
from .._pretrained_io import PretrainedIO
from ..attention.masks import keep_mask
from ..attention.multihead import MultiHeadAttention
from ..attention.packing import TokenPacking
from ..layers.dropout import Dropout
from ..layers.encoder_config import EncoderConfig
from ..layers.encoder_layer import EncoderLayerOutput, TransformerEncoderLayer, build_self_attention
from ..layers.positional import LearnedPositionalEmbedding, PaddingOffsetPositionalEmbedding, PositionalEncoding
from ..outputs import LayerAttentions, ModelOutput

__all__ = ["TransformerEncoder", "EncoderOutput", "find_encoder", "model_config_part",
           # the layer's names, re-exported for code written against attnlab.layers.encoder
           "TransformerEncoderLayer", "EncoderLayerOutput"]


@dataclass(eq=False)
class EncoderOutput(ModelOutput):
    """What :class:`TransformerEncoder` returns; unpacks as the article's ``x, attentions``.

    A :class:`~attnlab.outputs.ModelOutput`: ``out.last_hidden_state``, ``out[0]``,
    ``out["attentions"]``, ``out.to_tuple()``. The tuple is ``(last_hidden_state,
    attentions)`` (``attentions`` ``None`` unless asked), with ``hidden_states`` between
    them when asked for, as HuggingFace orders them.

    Attributes:
        last_hidden_state: ``[B, T, E]``.
        hidden_states: with ``output_hidden_states=True``, ``L + 1`` tensors ``[B, T, E]``:
            the embedding output, then every layer's output (the last one after the
            final LayerNorm, so it equals ``last_hidden_state``); else ``None``.
        attentions: with ``output_attentions=True``, a
            :class:`~attnlab.outputs.LayerAttentions` of ``[B, H, T, T]`` per layer:
            ``attentions[0]`` and ``attentions["layer_1"]`` are layer 1; else ``None``.
    """

    last_hidden_state: Tensor
    hidden_states: Optional[tuple[Tensor, ...]] = None
    attentions: Optional[LayerAttentions] = None

    _always_in_tuple = ("last_hidden_state", "attentions")


Config = TypeVar("Config")
_PRETRAINED_KEY = "pretrained_config"  # a pretrained family's HuggingFace config.json, kept by a checkpoint


def model_config_part(config: Any, config_class: type[Config], key: str, model: str) -> Config:
    """The ``config_class`` in ``config``, for a model's ``from_config``.

    Every model class builds itself from a config through one classmethod,
    ``Class.from_config(config, *, device=None, dtype=None)``, which takes its config
    dataclass, that dataclass's dict, or the ``config.json`` dict attnlab writes for the
    model (``{"model_type": ..., key: {...}, ...}``; :func:`attnlab.checkpoints.build_model`
    hands that dict to the class its ``model_type`` names).

    Raises:
        TypeError: ``config`` is neither a ``config_class`` nor a dict.
    """
    if isinstance(config, config_class):
        return config
    if not isinstance(config, dict):
        raise TypeError(f"{model}.from_config takes config: {config_class.__name__}, its dict, or a config.json "
                        f"dict; got {type(config).__name__}")
    return config_class.from_dict(config[key] if isinstance(config.get(key), dict) else config)


def _warn_real_padding(name: str, input_ids: Tensor, mask: Tensor, pad_id: int) -> None:
    """Warn when ``mask`` calls positions holding ``pad_id`` real tokens."""
    if input_ids.device.type == "meta":
        return
    contradicted = int(((input_ids == pad_id) & mask).sum())
    if contradicted:
        warnings.warn(
            f"{name} marks {contradicted} position(s) holding pad_id={pad_id} as real tokens; they are "
            f"attended to as the mask says. Pass a mask with 0 on padding, or none (it is then derived "
            f"from pad_id)",
            UserWarning,
            stacklevel=4,
        )


class TransformerEncoder(PretrainedIO, nn.Module):
    """Token embedding, positions, a stack of encoder layers and a final LayerNorm.

    The article's model, with its embedding scaling (``sqrt(d_model)``) and
    initialisation (Xavier-uniform matrices, embeddings ``N(0, d_model^-0.5)``).
    Every option of :class:`~attnlab.layers.encoder_config.EncoderConfig` can be passed
    as a keyword (``pad_id``, ``norm_first``, ``position``, ``attention_dropout``, ...).
    ``dropout`` applies to the embeddings, residual branches and feed-forward nets;
    attention probabilities are not dropped unless ``attention_dropout`` says so
    (``attention_dropout=None`` drops them with ``dropout``, as the article does).

    Padding is skipped (``skip_padding=True``, the default) when a ``[B, T]`` padding
    mask is known and the attention is dense: the layers then work on the real tokens
    alone, packed into ``[N, E]``, and each sequence attends over its own tokens. Real
    tokens get the same values as with every position computed; padding positions of
    ``last_hidden_state`` are zeros and padding queries have zero attention weights.

    Args:
        vocab_size: number of token ids.
        d_model: model width ``E``.
        num_layers: number of encoder layers ``L``.
        num_heads: attention heads ``H``.
        d_ff: feed-forward hidden width.
        dropout: dropout rate.
        max_len: longest accepted input. Long inputs need ``max_len >= T`` with
            sinusoidal or learned positions (the sinusoidal table holds
            ``max_len * d_model`` floats: 16 MiB at 16384 x 256), or ``position="rotary"``.
        **options: further :class:`EncoderConfig` fields; ``attention="sparse"`` (with
            ``block_size``, ``window``, ``global_summary``, ``global_tokens``) puts a
            :class:`~attnlab.attention.sparse.SparseAttention` in every layer, linear in ``T``.

    Components (keywords, default ``None`` = what the config says), the block spec of a
    pretrained family (see :mod:`attnlab.checkpoints.encoders`):

    * ``positions``: the position module instead of the config's (e.g.
      :class:`~attnlab.layers.positional.PaddingOffsetPositionalEmbedding`);
    * ``embedding_dim``: factorised embeddings: the tables are this wide and a
      ``Linear`` (``embedding_projection``) maps them to ``d_model`` (ALBERT, ELECTRA);
    * ``score_bias``: a module called as ``score_bias(T, S)`` whose ``[1, H, T, S]``
      result every layer adds to its scores (MPNet's relative position bias);
    * ``layer_factory``: ``layer_factory(index)`` builds each layer (e.g. with a gated
      feed-forward net or per-layer rotary bases);
    * ``norm_layer``: builds the embedding and final norms from their width.

    Shape:
        ``input_ids`` ``[B, T]`` integer; ``mask`` ``[B, T]`` (``True`` on real tokens)
        or an attention mask ``[B, 1, 1, T]`` / ``[B, 1, T, T]`` (``True`` = may
        attend); without a mask and with ``pad_id`` set, padding is found from the ids.
        Returns :class:`EncoderOutput` ``(last_hidden_state [B, T, E], attentions)``.

    Example:
        >>> model = TransformerEncoder(100, d_model=32, num_layers=2, num_heads=4, d_ff=64, pad_id=0)
        >>> x, attn = model(torch.tensor([[5, 6, 7, 0]]), output_attentions=True)
        >>> x.shape, attn["layer_2"].shape
        (torch.Size([1, 4, 32]), torch.Size([1, 4, 4, 4]))
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 512,
        num_layers: int = 6,
        num_heads: int = 8,
        d_ff: int = 2048,
        dropout: float = 0.1,
        max_len: int = 5000,
        *,
        device=None,
        dtype=None,
        positions: Optional[nn.Module] = None,
        embedding_dim: Optional[int] = None,
        score_bias: Optional[nn.Module] = None,
        layer_factory: Optional[Callable[[int], nn.Module]] = None,
        norm_layer: Optional[Callable[[int], nn.Module]] = None,
        **options,
    ) -> None:
        super().__init__()
        config = EncoderConfig(vocab_size, d_model, num_layers, num_heads, d_ff, dropout, max_len, **options)
        self.config = config
        self.d_model = d_model
        factory = {"device": device, "dtype": dtype}
        if norm_layer is None:
            norm_layer = lambda width: nn.LayerNorm(width, eps=config.layer_norm_eps, **factory)  # noqa: E731
        if embedding_dim is not None:
            check_positive_int("embedding_dim", embedding_dim)
        width = d_model if embedding_dim is None else embedding_dim  # of the embedding tables
        self.embedding = nn.Embedding(vocab_size, width, padding_idx=config.pad_id, **factory)
        if positions is not None:
            self.pos_encoding: Optional[nn.Module] = positions
        elif config.position == "sinusoidal":
            self.pos_encoding = PositionalEncoding(width, max_len, **factory)
        elif config.position == "learned":
            self.pos_encoding = LearnedPositionalEmbedding(width, max_len, **factory)
        else:
            self.pos_encoding = None
        self.token_type_embedding = (
            nn.Embedding(config.type_vocab_size, width, **factory) if config.type_vocab_size else None
        )
        self.embedding_norm = norm_layer(width) if config.embedding_norm else None
        self.dropout = Dropout(dropout)
        self.embedding_projection = (
            Linear(embedding_dim, d_model, **factory) if embedding_dim is not None else None
        )
        self.score_bias = score_bias
        self.layers = nn.ModuleList(
            layer_factory(index) if layer_factory is not None else TransformerEncoderLayer(
                d_model,
                num_heads,
                d_ff,
                dropout,
                attention_dropout=config.effective_attention_dropout,
                norm_first=config.norm_first,
                activation=config.activation,
                layer_norm_eps=config.layer_norm_eps,
                bias=config.bias,
                rotary=config.position == "rotary",
                self_attention=build_self_attention(config, **factory),
                **factory,
            )
            for index in range(num_layers)
        )
        self.layer_norm = norm_layer(d_model) if config.final_norm else None
        self._initialize_parameters()
        for name, heads in config.pruned_heads.items():  # a pruned model's shapes, before its weights load
            self.layers[int(name.removeprefix("layer_")) - 1].self_attn.prune_heads(heads)

    @classmethod
    def from_config(
        cls, config: Union[EncoderConfig, dict[str, Any]], *, device=None, dtype=None, **components
    ) -> "TransformerEncoder":
        """A fresh encoder from its config (and components, see the class): the protocol every
        model class follows (see :func:`model_config_part`).

        Args:
            config: an :class:`EncoderConfig`, its dict, or a model's ``config.json`` dict
                (its ``"encoder"`` entry is read).

        Raises:
            ValueError: ``config`` holds a pretrained family's HuggingFace config: that
                encoder's components are the family's, which
                :func:`attnlab.checkpoints.build_model` builds.
        """
        if isinstance(config, dict) and config.get(_PRETRAINED_KEY):
            raise ValueError(f"this config holds a pretrained family's {_PRETRAINED_KEY!r}: its encoder is built "
                             f"with the family's components; use attnlab.checkpoints.build_model(config)")
        values = model_config_part(config, EncoderConfig, "encoder", cls.__name__).to_dict()
        positional = [values.pop(name) for name in
                      ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "dropout", "max_len")]
        return cls(*positional, device=device, dtype=dtype, **components, **values)

    def _initialize_parameters(self) -> None:
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=self.d_model**-0.5)
        if self.config.pad_id is not None:
            with torch.no_grad():
                self.embedding.weight[self.config.pad_id].zero_()

    def _check_ids(self, input_ids: Tensor) -> None:
        if not isinstance(input_ids, Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be an integer tensor, got dtype {input_ids.dtype}")
        if input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"input_ids must lie in [0, vocab_size={self.config.vocab_size}), "
                    f"got values from {low} to {high}"
                )
        T = input_ids.shape[1]
        if self.config.position in ("sinusoidal", "learned") and T > self.config.max_len:
            raise ValueError(
                f"input length {T} exceeds max_len={self.config.max_len}; truncate the input "
                f"or build the encoder with a larger max_len"
            )

    def padding_mask_for(
        self,
        input_ids: Tensor,
        mask: Optional[Tensor],
        attention_mask: Optional[Tensor] = None,
        src_key_padding_mask: Optional[Tensor] = None,
    ) -> Optional[Tensor]:
        """The ``[B, T]`` bool padding mask, or a rank 3/4 attention mask, from whichever
        argument carries it (at most one); derived from ``pad_id`` when none does.

        A given ``[B, T]`` mask is used as given. Where it calls a position holding
        ``pad_id`` a real token, a ``UserWarning`` says how many (the mask and the ids
        disagree: usually a mask of ones, or rows padded after the mask was built); those
        positions are attended to. Positions the mask hides are hidden whatever their id.

        Task heads call this to pool over the same real tokens the encoder attends to.
        """
        B, T = input_ids.shape
        given = [(name, value) for name, value in (
            ("mask", mask), ("attention_mask", attention_mask), ("src_key_padding_mask", src_key_padding_mask)
        ) if value is not None]
        if len(given) > 1:
            raise ValueError(
                f"pass one padding mask, got {' and '.join(name for name, _ in given)}; attention_mask "
                f"(HuggingFace's name) and mask (the article's) mean the same: True/1 on real tokens"
            )
        if not given:
            if self.config.pad_id is None:
                return None
            return input_ids != self.config.pad_id
        name, mask = given[0]
        if name == "src_key_padding_mask":
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError(
                    "src_key_padding_mask follows torch.nn: a bool [B, T] tensor, True on padding; "
                    "pass other masks as attention_mask= with True/1 on real tokens"
                )
            mask = ~mask
        mask = keep_mask(mask, name=name, bias_argument=None)
        if mask.dim() == 2 and mask.shape != (B, T):
            raise ValueError(
                f"a 2-D {name} is a padding mask and must be [B, T] = [{B}, {T}], got {tuple(mask.shape)}"
            )
        if mask.dim() == 2 and self.config.pad_id is not None:
            _warn_real_padding(name, input_ids, mask, self.config.pad_id)
        return mask  # rank 3 or 4: an attention mask, validated by the attention

    def _packing(self, mask: Optional[Tensor]) -> Optional[TokenPacking]:
        """How to skip padding in position-wise work, or ``None`` when it does not apply."""
        if not self.config.skip_padding:
            return None
        if not all(
            type(layer) is TransformerEncoderLayer
            and isinstance(layer.self_attn, MultiHeadAttention)
            and layer.self_attn.supports_packing()
            for layer in self.layers
        ):
            return None  # sparse attention, or layers replaced or wrapped: the padded layout
        return TokenPacking.for_padding(mask)

    def embed(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None) -> Tensor:
        """Token (+ position, + token type) embeddings before the first layer; ``[B, T, E]``."""
        x = self.embedding(input_ids)  # [B, T, E]
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.d_model)
        if self.token_type_embedding is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            elif token_type_ids.shape != input_ids.shape:
                raise ValueError(
                    f"token_type_ids must match input_ids {tuple(input_ids.shape)}, "
                    f"got {tuple(token_type_ids.shape)}"
                )
            x = x + self.token_type_embedding(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but the encoder has type_vocab_size=0")
        if isinstance(self.pos_encoding, PaddingOffsetPositionalEmbedding):
            x = self.pos_encoding(x, input_ids=input_ids)  # positions counted over real tokens
        elif self.pos_encoding is not None:
            x = self.pos_encoding(x)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.dropout(x)
        if self.embedding_projection is not None:
            x = self.embedding_projection(x)  # [B, T, E]
        return x

    def _layer_head_masks(self, head_mask: Optional[Tensor]) -> list[Optional[Tensor]]:
        L, H = self.config.num_layers, self.config.num_heads
        if head_mask is None:
            return [None] * L
        if head_mask.shape == (H,):
            return [head_mask] * L
        if head_mask.dim() == 2 and head_mask.shape == (L, H):
            return list(head_mask.unbind(0))
        raise ValueError(f"head_mask must be [H]=[{H}] or [L, H]=[{L}, {H}], got {tuple(head_mask.shape)}")

    def forward(
        self,
        input_ids: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        src_key_padding_mask: Optional[Tensor] = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        head_mask: Optional[Tensor] = None,
        return_dict: Optional[bool] = None,
    ) -> EncoderOutput:
        """Encode ``input_ids``.

        Args:
            input_ids: ``[B, T]`` token ids.
            mask: ``[B, T]`` padding mask (``True`` / 1 on real tokens, any dtype) or an
                attention mask of rank 3/4; derived from ``pad_id`` when omitted.
            attention_mask: HuggingFace's name for the ``[B, T]`` padding mask; give
                ``mask`` or ``attention_mask``, not both.
            token_type_ids: ``[B, T]`` segment ids (needs ``type_vocab_size > 0``).
            src_key_padding_mask: ``torch.nn``'s padding mask, bool, ``True`` on padding.
            output_attentions: also return every layer's per-head weights.
            output_hidden_states: also return the embedding output and every layer's output.
            head_mask: ``[H]`` or ``[L, H]`` multipliers of each head's output
                (0 ablates a head).
            return_dict: ``False`` returns ``out.to_tuple()``, as in HuggingFace.
        """
        check_inputs_match(self, "TransformerEncoder", {"input_ids": input_ids, "mask": mask,
                                                        "attention_mask": attention_mask}, dtype=False)
        self._check_ids(input_ids)
        mask = self.padding_mask_for(input_ids, mask, attention_mask, src_key_padding_mask)
        packing = self._packing(mask)
        if packing is not None:
            layer_mask = None  # the packing keeps padding keys out
        elif mask is not None and mask.dim() == 2:
            layer_mask = mask[:, None, None, :]  # [B, 1, 1, T]
        else:
            layer_mask = mask
        x = self.embed(input_ids, token_type_ids)  # [B, T, E]
        if packing is not None:
            x = packing.pack(x)  # [N, E]: the real tokens only
        unpacked = (lambda h: h) if packing is None else packing.unpack  # [B, T, E], zeros at padding
        hidden_states: Optional[list[Tensor]] = [unpacked(x)] if output_hidden_states else None
        attentions: list[Optional[Tensor]] = []
        bias = None
        if self.score_bias is not None:
            T = input_ids.shape[1]
            bias = self.score_bias(T, T).to(x.dtype)  # [1, H, T, T], shared by every layer
        for layer, layer_head_mask in zip(self.layers, self._layer_head_masks(head_mask)):
            extra = {} if packing is None else {"packing": packing}  # replaced layers need not take it
            if bias is not None:
                extra["attn_bias"] = bias
            x, weights = layer(
                x, layer_mask, need_weights=output_attentions, head_mask=layer_head_mask, **extra
            )
            attentions.append(weights)
            if hidden_states is not None:
                hidden_states.append(unpacked(x))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = unpacked(x)
        if hidden_states is not None:
            hidden_states[-1] = x  # as HuggingFace: the last entry after the final norm
        output = EncoderOutput(
            x,
            tuple(hidden_states) if hidden_states is not None else None,
            LayerAttentions(attentions) if output_attentions else None,
        )
        return output.to_tuple() if return_dict is False else output


def find_encoder(model: nn.Module, attributes: tuple[str, ...] = ("encoder",)) -> Optional[TransformerEncoder]:
    """``model`` itself if it is a :class:`TransformerEncoder`, else the first of its
    ``attributes`` that holds one (``None`` when none does)."""
    if isinstance(model, TransformerEncoder):
        return model
    for name in attributes:
        encoder = getattr(model, name, None)
        if isinstance(encoder, TransformerEncoder):
            return encoder
    return None
