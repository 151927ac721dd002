"""Encoder-decoder models (T5, BART, Marian, ...): one source/target pair's attention, and generation.

Dimension letters: ``H`` heads, ``S`` source length, ``T`` target (decoder input) length,
``E`` hidden size, ``G`` generated tokens.

:func:`pair_attention` runs the model once on a source and a decoder input under
:func:`~attnlab.hf.attach` and returns the three kinds of maps apart: the encoder's
self-attention ``[H, S, S]``, the decoder's causal self-attention ``[H, T, T]`` and the
cross-attention ``[H, T, S]`` (rows: target positions, columns: source positions), with
both sides' hidden states for similarity alignment. :func:`generate_pair` generates a
target with ``model.generate`` and returns the same for the generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .backend import attach

__all__ = ["PairAttention", "decoder_start", "generate_pair", "pair_attention"]


@dataclass
class PairAttention:
    """One source/target pair's attention, one example (no batch dimension).

    Attributes:
        source_ids: ``[S]`` encoder input ids (``None`` for a speech model's features).
        target_ids: ``[T]`` decoder input ids (the decoder start token first).
        encoder: ``{"encoder.layer_k": [H, S, S]}``.
        decoder: ``{"decoder.layer_k": [H, T, T]}``.
        cross: ``{"cross.layer_k": [H, T, S]}``: target rows over source columns.
        encoder_hidden: ``[S, E]`` per layer (the embeddings' output first).
        decoder_hidden: ``[T, E]`` per layer.
    """

    source_ids: Tensor
    target_ids: Tensor
    encoder: dict[str, Tensor] = field(default_factory=dict)
    decoder: dict[str, Tensor] = field(default_factory=dict)
    cross: dict[str, Tensor] = field(default_factory=dict)
    encoder_hidden: tuple = ()
    decoder_hidden: tuple = ()


def _is_seq2seq(model: nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def decoder_start(model: nn.Module) -> int:
    """The token the decoder starts from (``decoder_start_token_id``, else ``bos_token_id``)."""
    for owner in (getattr(model, "generation_config", None), model.config):
        for key in ("decoder_start_token_id", "bos_token_id"):
            value = getattr(owner, key, None)
            if isinstance(value, int):
                return value
    raise ValueError(f"{type(model).__name__}'s config names no decoder_start_token_id; attnlab cannot start "
                     f"its decoder")


def _check(model: nn.Module, name: str, ids: Any) -> None:
    if not _is_seq2seq(model):
        raise ValueError(f"{type(model).__name__} is not an encoder-decoder model (config.is_encoder_decoder "
                         f"is not set); give T5, BART, Marian, mBART or a model like them")
    if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-d tensor of token ids, got {getattr(ids, 'shape', ids)}")


def _split(weights: Any) -> tuple[dict, dict, dict]:
    encoder, decoder, cross = {}, {}, {}
    for name, value in weights.items():
        one = value[0].detach().float()  # [H, rows, keys]
        (cross if name.startswith("cross.") else decoder if name.startswith("decoder.") else encoder)[name] = one
    return encoder, decoder, cross


def pair_attention(model: nn.Module, source_ids: Optional[Tensor], target_ids: Tensor, *,
                   hidden_states: bool = False, source_features: Optional[Tensor] = None) -> PairAttention:
    """Every attention map of one source/target pair (see the module docstring).

    Args:
        model: a transformers encoder-decoder (``T5ForConditionalGeneration``, ``BartModel``, ...).
        source_ids: ``[S]`` source token ids.
        target_ids: ``[T]`` decoder input ids, the start token first (see :func:`decoder_start`).
        hidden_states: also return both sides' hidden states.
        source_features: ``[C, frames]`` instead of ids, for a speech model (Whisper's
            ``input_features``); ``source_ids`` is then ``None``.
    """
    if source_features is None:
        _check(model, "source_ids", source_ids)
        source = {"input_ids": source_ids[None]}
    else:
        _check(model, "target_ids", target_ids)  # the model check
        if not isinstance(source_features, Tensor) or source_features.dim() != 2:
            raise ValueError(f"source_features must be one example's [C, frames], got "
                             f"{getattr(source_features, 'shape', source_features)}")
        source = {"input_features": source_features[None]}
    _check(model, "target_ids", target_ids)
    with torch.no_grad(), attach(model, layers="all") as seen:
        out = model(**source, decoder_input_ids=target_ids[None], output_hidden_states=hidden_states,
                    use_cache=False)
        weights = {**dict(seen.attentions.items()), **dict(seen.cross_attentions.items())}
    order = [site.name for site in seen.sites]
    encoder, decoder, cross = _split({name: weights[name] for name in order if name in weights})
    result = PairAttention(source_ids, target_ids, encoder, decoder, cross)
    if hidden_states:
        result.encoder_hidden = tuple(h[0].float() for h in out.encoder_hidden_states)
        result.decoder_hidden = tuple(h[0].float() for h in out.decoder_hidden_states)
    return result


def generate_pair(model: nn.Module, source_ids: Tensor, *, max_new_tokens: int = 32,
                  **generate_options: Any) -> PairAttention:
    """Generate a target for ``source_ids`` and return every map of the pair.

    The maps come from one forward pass over the finished decoder input (the start token
    and the generated tokens): under causal masking each row equals the row the decoder
    computed when it generated that token, cached or not (greedy or sampled alike).

    Returns:
        :class:`PairAttention` whose ``target_ids`` are ``[start, generated tokens]``.
    """
    _check(model, "source_ids", source_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    with torch.no_grad():
        sequences = model.generate(input_ids=source_ids[None], attention_mask=torch.ones_like(source_ids)[None],
                                   max_new_tokens=max_new_tokens, **generate_options)  # [1, 1 + G]
    return pair_attention(model, source_ids, sequences[0], hidden_states=False)
