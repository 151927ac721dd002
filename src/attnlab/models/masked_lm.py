"""Masked-language-model head on top of a :class:`~attnlab.TransformerEncoder`."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn
from torch.nn import functional as F

from .._precision import Linear
from ..layers import TransformerEncoder
from .outputs import ModelOutput

__all__ = ["EncoderForMaskedLM"]


class EncoderForMaskedLM(nn.Module):
    """BERT's masked-LM head: dense + GELU + LayerNorm, then a decoder tied to the
    token embedding.

    Shape:
        ``input_ids`` ``[B, T]``; ``mask`` ``[B, T]`` padding mask (``True`` = real token,
        may attend); ``labels`` ``[B, T]`` token ids, -100 where nothing is predicted
        -> :class:`ModelOutput` with ``logits`` ``[B, T, V]``; given ``labels``, ``logits``
        are those of the labelled positions only, ``[N, V]`` in the order of
        ``labels != -100``, and ``loss`` is their mean cross-entropy.
    """

    model_type = "encoder_masked_lm"

    def __init__(self, encoder: TransformerEncoder, *, device=None, dtype=None) -> None:
        super().__init__()
        E, V = encoder.config.d_model, encoder.config.vocab_size
        factory = {"device": device, "dtype": dtype}
        self.encoder = encoder
        self.transform = Linear(E, E, **factory)
        self.transform_norm = nn.LayerNorm(E, eps=encoder.config.layer_norm_eps, **factory)
        self.decoder = Linear(E, V, **factory)
        self.decoder.weight = encoder.embedding.weight  # tied: one matrix in and out

    def head_config(self) -> dict[str, Any]:
        return {}

    def _predict(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.transform_norm(F.gelu(self.transform(hidden))))  # [..., V]

    def forward(
        self,
        input_ids: Tensor,
        mask: Optional[Tensor] = None,
        *,
        output_attentions: bool = False,
        head_mask: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
    ) -> ModelOutput:
        hidden, attentions = self.encoder(input_ids, mask, output_attentions=output_attentions, head_mask=head_mask)
        if labels is None:
            return ModelOutput(logits=self._predict(hidden), attentions=attentions, last_hidden_state=hidden)
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
        return ModelOutput(logits=logits, loss=loss, attentions=attentions, last_hidden_state=hidden)
