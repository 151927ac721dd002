"""Sequence classification on top of a :class:`~attnlab.TransformerEncoder`."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .._checks import check_positive_int, check_probability
from .._masked_mean import masked_mean
from .._precision import Linear
from .._pretrained_io import PretrainedIO
from ._task_config import EncoderTaskConfig
from .encoder import TransformerEncoder
from .outputs import TaskOutput

__all__ = ["DensePooler", "EncoderClassifier", "POOLINGS", "POOLER_ACTIVATIONS", "pool"]

POOLINGS = ("mean", "first")
POOLER_ACTIVATIONS = {
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class DensePooler(nn.Module):
    """``norm(activation(dense(x)))`` on the pooled vector: the layer pretrained
    classification heads put before their classifier (BERT's pooler, RoBERTa's
    ``classifier.dense``, ModernBERT's ``head``).

    Args:
        d_model: width ``E``.
        activation: ``"tanh"`` (BERT, RoBERTa, ALBERT, MPNet), ``"gelu"`` (ELECTRA,
            ModernBERT), ``"gelu_tanh"`` or ``"relu"`` (DistilBERT).
        bias: a bias on the dense layer.
        norm_eps: a LayerNorm after the activation with this epsilon (``None``: none).
        norm_bias: a bias on that LayerNorm.

    Shape:
        ``[B, E]`` -> ``[B, E]``.
    """

    def __init__(
        self,
        d_model: int,
        activation: str = "tanh",
        *,
        bias: bool = True,
        norm_eps: Optional[float] = None,
        norm_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in POOLER_ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(POOLER_ACTIVATIONS)}, got {activation!r}")
        if norm_eps is not None and not norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0 or None, got {norm_eps!r}")
        self.settings = {"activation": activation, "bias": bias, "norm_eps": norm_eps, "norm_bias": norm_bias}
        self.dense = Linear(d_model, d_model, bias=bias, device=device, dtype=dtype)
        self.norm = (None if norm_eps is None else
                     nn.LayerNorm(d_model, eps=norm_eps, bias=norm_bias, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        x = POOLER_ACTIVATIONS[self.settings["activation"]](self.dense(x))
        return x if self.norm is None else self.norm(x)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value!r}" for name, value in self.settings.items())


def pool(hidden: Tensor, mask: Optional[Tensor], pooling: str) -> Tensor:
    """One vector per sequence: the first token's, or the mean over real tokens.

    Shape:
        ``hidden`` ``[B, T, E]``, ``mask`` ``[B, T]`` (``True`` on real tokens) -> ``[B, E]``.
    """
    if pooling == "first":
        return hidden[:, 0]
    return masked_mean(hidden, mask, keepdim=False)


class EncoderClassifier(EncoderTaskConfig, PretrainedIO, nn.Module):
    """An encoder, a pooling step and a linear classifier.

    Args:
        encoder: the :class:`TransformerEncoder` to classify with.
        num_labels: number of classes ``C``.
        pooling: ``"mean"`` (masked mean over real tokens) or ``"first"`` (the first
            token, ``[CLS]`` for the tokenizers in :mod:`attnlab.data`).
        dropout: dropout before the classifier.
        label_names: optional names of the classes, saved with the model.
        pooler: ``{"activation": "tanh"}`` (and any other :class:`DensePooler`
            keyword) puts a :class:`DensePooler` between the pooling step and the
            classifier, as pretrained classification heads have.

    Shape:
        ``input_ids`` ``[B, T]``; ``mask`` or ``attention_mask`` ``[B, T]`` padding mask
        (``True`` / 1 = real token, any dtype), derived from the encoder's ``pad_id`` when
        omitted; ``token_type_ids`` ``[B, T]``; ``labels`` ``[B]``
        -> :class:`~attnlab.models.outputs.TaskOutput` with ``logits`` ``[B, C]``
        (``out[0]`` is the loss when labels were given, as in HuggingFace).

    Example:
        >>> encoder = TransformerEncoder(100, d_model=32, num_layers=1, num_heads=4, d_ff=64, pad_id=0)
        >>> EncoderClassifier(encoder, 2)(torch.tensor([[5, 6, 0]])).logits.shape
        torch.Size([1, 2])
    """

    model_type = "encoder_classifier"

    def __init__(
        self,
        encoder: TransformerEncoder,
        num_labels: int,
        *,
        pooling: str = "mean",
        dropout: float = 0.1,
        label_names: Optional[Sequence[str]] = None,
        pooler: Optional[dict[str, Any]] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        check_positive_int("num_labels", num_labels)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if label_names is not None and len(label_names) != num_labels:
            raise ValueError(f"label_names has {len(label_names)} names for num_labels={num_labels}")
        self.encoder = encoder
        self.pooling = pooling
        self.num_labels = num_labels
        self.label_names = None if label_names is None else [str(name) for name in label_names]
        self.classifier_dropout = check_probability("dropout", dropout)
        self.dropout = nn.Dropout(dropout)
        if pooler is not None and (not isinstance(pooler, dict) or
                                   set(pooler) - {"activation", "bias", "norm_eps", "norm_bias"}):
            raise ValueError(f"pooler must be None or a dict like {{'activation': 'tanh'}}, got {pooler!r}")
        self.pooler = None if pooler is None else DensePooler(encoder.config.d_model, **pooler, device=device,
                                                              dtype=dtype)
        self.classifier = Linear(encoder.config.d_model, num_labels, device=device, dtype=dtype)

    def head_config(self) -> dict[str, Any]:
        """The constructor arguments besides the encoder (saved in ``config.json``)."""
        return {
            "num_labels": self.num_labels,
            "pooling": self.pooling,
            "dropout": self.classifier_dropout,
            "label_names": self.label_names,
            **({} if self.pooler is None else {"pooler": dict(self.pooler.settings)}),
        }

    def forward(
        self,
        input_ids: Tensor,
        mask: Optional[Tensor] = None,
        *,
        attention_mask: Optional[Tensor] = None,
        token_type_ids: Optional[Tensor] = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        head_mask: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
        return_dict: Optional[bool] = None,
    ) -> TaskOutput:
        mask = self.encoder.padding_mask_for(input_ids, mask, attention_mask)
        if mask is not None and mask.dim() != 2:
            raise ValueError(f"mask must be a [B, T] padding mask, got shape {tuple(mask.shape)}")
        encoded = self.encoder(
            input_ids,
            mask,
            token_type_ids=token_type_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            head_mask=head_mask,
        )
        hidden = encoded.last_hidden_state  # [B, T, E]
        pooled = pool(hidden, mask, self.pooling)  # [B, E]
        if self.pooler is not None:
            pooled = self.pooler(self.dropout(pooled))
        logits = self.classifier(self.dropout(pooled))  # [B, C]
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:1]:
                raise ValueError(f"labels must be [B]={[logits.shape[0]]}, got {tuple(labels.shape)}")
            loss = F.cross_entropy(logits.float(), labels)
        output = TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions, hidden)
        return output.to_tuple() if return_dict is False else output
