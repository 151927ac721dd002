"""Masked-language-model head on top of a :class:`~attnlab.TransformerEncoder`."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn
from torch.nn import functional as F

from .._precision import Linear
from .._pretrained_io import PretrainedIO
from ._task_config import EncoderTaskConfig
from .encoder import TransformerEncoder
from ..layers.ffn import resolve_activation
from .outputs import TaskOutput

__all__ = ["EncoderForMaskedLM"]


class EncoderForMaskedLM(EncoderTaskConfig, PretrainedIO, nn.Module):
    """BERT's masked-LM head: dense + GELU + LayerNorm, then a decoder tied to the
    token embedding.

    The dense layer maps to the width of the token embedding (narrower than the model
    in ALBERT and ELECTRA). The keywords reproduce other families' heads and are saved
    with the model when they differ from BERT's.

    Args:
        encoder: the encoder whose token embedding the decoder shares.
        activation: ``"gelu"`` (default), ``"gelu_tanh"``, ``"relu"`` or ``"silu"``.
        norm_eps: the LayerNorm's epsilon (default: the encoder's).
        transform_bias: a bias on the dense layer.
        norm_bias: a bias on the LayerNorm.

    Shape:
        ``input_ids`` ``[B, T]``; ``mask`` or ``attention_mask`` ``[B, T]`` padding mask
        (``True`` / 1 = real token, any dtype); ``labels`` ``[B, T]`` token ids, -100 where
        nothing is predicted -> :class:`~attnlab.models.outputs.TaskOutput` with ``logits``
        ``[B, T, V]``; given ``labels``, ``logits``
        are those of the labelled positions only, ``[N, V]`` in the order of
        ``labels != -100``, and ``loss`` is their mean cross-entropy.
    """

    model_type = "encoder_masked_lm"

    def __init__(
        self,
        encoder: TransformerEncoder,
        *,
        activation: str = "gelu",
        norm_eps: Optional[float] = None,
        transform_bias: bool = True,
        norm_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        E, V = encoder.config.d_model, encoder.config.vocab_size
        width = encoder.embedding.weight.shape[1]  # of the token embedding the decoder shares
        factory = {"device": device, "dtype": dtype}
        self.encoder = encoder
        self.activation = resolve_activation(activation)
        norm_eps = encoder.config.layer_norm_eps if norm_eps is None else norm_eps
        self.settings = {"activation": activation, "norm_eps": norm_eps, "transform_bias": transform_bias,
                          "norm_bias": norm_bias}
        self.transform = Linear(E, width, bias=transform_bias, **factory)
        self.transform_norm = nn.LayerNorm(width, eps=norm_eps, bias=norm_bias, **factory)
        self.decoder = Linear(width, V, **factory)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the decoder's matrix with the token embedding (again, after a load that assigned it)."""
        self.decoder.weight = self.encoder.embedding.weight  # tied: one matrix in and out

    def head_config(self) -> dict[str, Any]:
        """The keywords that differ from BERT's head (saved in ``config.json``)."""
        bert = {"activation": "gelu", "norm_eps": self.encoder.config.layer_norm_eps, "transform_bias": True,
                "norm_bias": True}
        return {name: value for name, value in self.settings.items() if value != bert[name]}

    def _predict(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.transform_norm(self.activation(self.transform(hidden))))  # [..., V]

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
        encoded = self.encoder(
            input_ids,
            mask,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            head_mask=head_mask,
        )
        hidden = encoded.last_hidden_state  # [B, T, E]
        extras = (encoded.hidden_states, encoded.attentions, hidden)
        if labels is None:
            output = TaskOutput(None, self._predict(hidden), *extras)
            return output.to_tuple() if return_dict is False else output
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels must match input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}")
        # Only the labelled positions go through the vocabulary projection (about 15 %
        # of tokens): the [B, T, V] scores of every position would dominate the cost.
        selected = labels != -100  # [B, T]
        logits = self._predict(hidden[selected])  # [N, V]
        if logits.shape[0]:
            loss = F.cross_entropy(logits.float(), labels[selected])
        else:
            loss = logits.sum() * 0.0  # nothing masked in this batch: zero, not NaN
        output = TaskOutput(loss, logits, *extras)
        return output.to_tuple() if return_dict is False else output
