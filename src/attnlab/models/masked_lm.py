"""Masked-language-model head on top of a :class:`~attnlab.TransformerEncoder`."""

from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn
from torch.nn import functional as F

from ..layers import TransformerEncoder
from .outputs import ModelOutput

__all__ = ["EncoderForMaskedLM"]


class EncoderForMaskedLM(nn.Module):
    """BERT's masked-LM head: dense + GELU + LayerNorm, then a decoder tied to the
    token embedding.

    Shape:
        ``input_ids`` ``[B, T]``; ``mask`` ``[B, T]`` padding mask (``True`` = real token,
        may attend); ``labels`` ``[B, T]`` token ids, -100 where nothing is predicted
        -> :class:`ModelOutput` with ``logits`` ``[B, T, V]`` and ``loss`` the mean over
        predicted tokens.
    """

    model_type = "encoder_masked_lm"

    def __init__(self, encoder: TransformerEncoder, *, device=None, dtype=None) -> None:
        super().__init__()
        E, V = encoder.config.d_model, encoder.config.vocab_size
        factory = {"device": device, "dtype": dtype}
        self.encoder = encoder
        self.transform = nn.Linear(E, E, **factory)
        self.transform_norm = nn.LayerNorm(E, eps=encoder.config.layer_norm_eps, **factory)
        self.decoder = nn.Linear(E, V, **factory)
        self.decoder.weight = encoder.embedding.weight  # tied: one matrix in and out

    def head_config(self) -> dict[str, Any]:
        return {}

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
        logits = self.decoder(self.transform_norm(F.gelu(self.transform(hidden))))  # [B, T, V]
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels must match input_ids {tuple(input_ids.shape)}, got {tuple(labels.shape)}")
            # [B*T, V] against [B*T]; a batch with nothing masked gives loss 0, not NaN
            flat_logits, flat_labels = logits.flatten(0, 1).float(), labels.flatten()
            if (flat_labels != -100).any():
                loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
            else:
                loss = flat_logits.sum() * 0.0
        return ModelOutput(logits=logits, loss=loss, attentions=attentions, last_hidden_state=hidden)
