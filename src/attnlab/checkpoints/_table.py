"""What a pretrained family is: a conversion table plus a block spec.

A :class:`Family` says, for one HuggingFace layout:

* which ``config.json`` keys make which :class:`~attnlab.EncoderConfig` fields, and back
  (``config_from_hf``, ``config_to_hf``);
* the block spec: the components handed to :class:`~attnlab.TransformerEncoder`
  (``components``: a position scheme, factorised embeddings, a score bias, a layer
  factory), all built from the checkpoint's config;
* which HuggingFace module holds each attnlab module (``embeddings``, ``layer``,
  ``qkv``), and where a shared layer's weights live (``hf_layer``);
* how its ``*ForSequenceClassification`` head maps onto
  :class:`~attnlab.EncoderClassifier` (``classifier``).

The conversion itself (:mod:`attnlab.checkpoints._convert`) is the same for every
family; tensor shapes are checked against the encoder the config builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

from ..layers import EncoderConfig
from ..models.encoder import TransformerEncoder
from .errors import UnsupportedCheckpointError, problems_error

__all__ = ["ClassifierTable", "Family", "MaskedLMTable", "UnsupportedCheckpointError", "problems_error"]


@dataclass(frozen=True)
class ClassifierTable:
    """Where a ``*ForSequenceClassification`` head's tensors live, and how it pools.

    Attributes:
        architecture: the HuggingFace class name (``"RobertaForSequenceClassification"``).
        classifier: HF module of the last ``Linear`` (``"classifier.out_proj"``).
        pooler: HF module of the dense layer before it (``"classifier.dense"``), ``None``
            when there is none; names under the base model's prefix are written with it
            (``"pooler.dense"`` of BERT is ``bert.pooler.dense``).
        pooler_norm: HF module of a LayerNorm after that layer (ModernBERT's ``head.norm``).
        activation: the dense layer's activation (``"tanh"``, ``"gelu"``, ``"relu"``).
        pooling: ``"first"`` (the ``[CLS]``/``<s>`` token) or ``"mean"``.
        from_config: settings the checkpoint's config decides, overriding the above
            (``pooling``, ``activation``, and :class:`~attnlab.models.classifier.DensePooler`'s
            ``bias``, ``norm_eps``, ``norm_bias``).
    """

    architecture: str
    classifier: str
    pooler: Optional[str] = None
    pooler_norm: Optional[str] = None
    activation: Optional[str] = "tanh"
    pooling: str = "first"
    from_config: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda values: {})

    def settings(self, values: dict[str, Any]) -> dict[str, Any]:
        """``{"pooling": ..., "pooler": DensePooler keywords or None}`` for a config."""
        read = {"pooling": self.pooling, "activation": self.activation, **self.from_config(values)}
        pooling = read.pop("pooling")
        if self.pooler is None:
            return {"pooling": pooling, "pooler": None}
        pooler = {
            "activation": read.pop("activation"),
            "bias": True,
            "norm_eps": None,
            "norm_bias": True,
            **read,
        }
        return {"pooling": pooling, "pooler": pooler}

    def modules(self) -> dict[str, str]:
        """attnlab head module -> HF module."""
        head = {"classifier": self.classifier}
        if self.pooler is not None:
            head["pooler.dense"] = self.pooler
        if self.pooler_norm is not None:
            head["pooler.norm"] = self.pooler_norm
        return head


@dataclass(frozen=True)
class MaskedLMTable:
    """Where a ``*ForMaskedLM`` head's tensors live (its decoder matrix is the token embedding).

    Attributes:
        architecture: the HuggingFace class name (``"RobertaForMaskedLM"``).
        transform: HF module of the dense layer (``"lm_head.dense"``).
        norm: HF module of the LayerNorm after it (``"lm_head.layer_norm"``).
        bias: HF tensor of the decoder's bias (``"lm_head.bias"``).
        decoder: HF module of the decoder, whose matrix (and bias, when the file repeats
            them) are the token embedding and ``bias`` again: skipped when present.
        settings: :class:`~attnlab.EncoderForMaskedLM` keywords from the config
            (``activation``, ``norm_eps``, ``transform_bias``, ``norm_bias``).
    """

    architecture: str
    transform: str
    norm: str
    bias: str
    decoder: str = ""
    settings: Callable[[dict[str, Any]], dict[str, Any]] = field(default=lambda values: {})

    def modules(self) -> dict[str, str]:
        """attnlab head module (or tensor) -> HF module (or tensor); the decoder's matrix is tied."""
        return {"transform": self.transform, "transform_norm": self.norm, "decoder.bias": self.bias}


Components = Callable[[dict[str, Any], EncoderConfig], dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """One HuggingFace layout; see the module docstring.

    Attributes:
        name: the family's name (``"roberta"``).
        model_types: ``config.json`` ``model_type`` values it reads.
        architecture: the base model class written on export (``"RobertaModel"``).
        base_prefix: the base model's prefix in task checkpoints (``"roberta."``).
        config_from_hf: ``(config.json dict, source) -> EncoderConfig``; raises
            :class:`UnsupportedCheckpointError` listing every problem.
        config_to_hf: ``(encoder, the checkpoint's own config or None) -> dict``.
        embeddings: attnlab module path -> HF module path, outside the layers.
        layer_prefix: HF prefix of layer ``k`` (``"encoder.layer.{}."``).
        layer: attnlab module path in a layer -> HF module path in that layer.
        qkv: HF module(s) of the query, key and value projections in a layer: three
            names (concatenated into ``in_proj``), or one packed module.
        components: the block spec: :class:`~attnlab.TransformerEncoder` keywords built
            from the checkpoint's config.
        hf_layer: ``(config dict, attnlab layer index) -> HF layer index`` (ALBERT's
            layers share one set of weights).
        after_load: called on the loaded encoder (ALBERT ties its layers' parameters).
        classifier: the ``*ForSequenceClassification`` head, if the family has one.
        masked_lm: the ``*ForMaskedLM`` head, if the family has one.
        ignored: HF tensors (after the base prefix) the encoder does not use.
    """

    name: str
    model_types: tuple[str, ...]
    architecture: str
    base_prefix: str
    config_from_hf: Callable[[dict[str, Any], str], EncoderConfig]
    config_to_hf: Callable[[TransformerEncoder, Optional[dict[str, Any]]], dict[str, Any]]
    embeddings: Mapping[str, str]
    layer_prefix: str
    layer: Mapping[str, str]
    qkv: Union[str, tuple[str, str, str]]
    components: Components = field(default=lambda values, config: {})
    hf_layer: Callable[[dict[str, Any], int], int] = field(default=lambda values, index: index)
    after_load: Callable[[TransformerEncoder, dict[str, Any]], None] = field(
        default=lambda encoder, values: None
    )
    classifier: Optional[ClassifierTable] = None
    masked_lm: Optional[MaskedLMTable] = None
    ignored: tuple[str, ...] = ("pooler.", "embeddings.position_ids", "embeddings.token_type_ids")

    def build(
        self, values: dict[str, Any], config: EncoderConfig, *, device=None, dtype=None
    ) -> TransformerEncoder:
        """The encoder the checkpoint's config describes, freshly initialised."""
        return TransformerEncoder.from_config(
            config, device=device, dtype=dtype, **self.components(values, config)
        )
