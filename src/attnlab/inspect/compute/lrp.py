"""LRP relevance of every attention map of an encoder classifier (Chefer, Gur & Wolf, CVPR 2021).

Dimension letters: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head dim, ``E`` model
dim, ``C`` classes.

*Transformer Interpretability Beyond Attention Visualization* propagates relevance from
the explained class back through the network with layer-wise relevance propagation and
reads, in every layer, the relevance ``R_l`` of the ``[B, H, T, T]`` attention map; the
``relevance`` attribution then weights it by the map's gradient
(:func:`~attnlab.inspect.compute.gradient_rollout.gradient_weighted_rollout`).

The propagation follows the paper's public code (``BERT_explainability``: the rules of
``layers_ours.py``, the order of ``BERT.py``, the start of ``generate_LRP``), with the
rules of :mod:`~attnlab.inspect.compute.lrp_rules`:

* Start: relevance 1 on the explained class and 0 on the others (``generate_LRP`` hands
  the one-hot vector itself to ``relprop``, not its product with the logit).
* Classifier and pooler dense layers, attention projections (Q, K, V, output) and both
  feed-forward projections: LRP alpha-1-beta-0 (``linear_relevance``).
* LayerNorm, activations (GELU, tanh, ...), softmax and dropout: relevance passes
  through unchanged, as in their code (their ``LayerNorm`` is a plain ``RelProp``
  module, whose ``relprop`` returns its input).
* Residual additions: the re-normalised split of ``add_relevance``; a tensor used by
  several branches sums their relevances (``clone_relevance``).
* Attention: the output projection, then ``A @ V`` (``matmul_relevance``: half to the
  map, half to the values) — the map's share is ``R_l`` — then softmax (through), a
  score bias if the encoder has one (``add_relevance``, as their mask addition), and
  ``Q K^T`` (half to each).
* Pooling: first token or the mean over real tokens (gradient x input over the output).

Differences from their script: every example of a batch is normalised on its own (their
residual split sums over the whole batch; the same for one example).

Supported: :class:`~attnlab.EncoderClassifier` (pooling ``"first"`` or ``"mean"``, with or
without a :class:`~attnlab.models.classifier.DensePooler`) over a
:class:`~attnlab.TransformerEncoder` of :class:`~attnlab.layers.encoder_layer.TransformerEncoderLayer`
with dense :class:`~attnlab.MultiHeadAttention` (sliding window allowed), a
:class:`~attnlab.layers.ffn.PositionWiseFFN` and ``nn.LayerNorm``, post-norm or
pre-norm, with or without a score bias (MPNet's relative positions): the BERT, RoBERTa,
XLM-R, DistilBERT, ELECTRA, ALBERT, MPNet and MiniLM families and models trained with
attnlab. Rotary positions (ModernBERT), gated feed-forward nets, DeBERTa's disentangled
attention and sparse attention are refused with an error that names them; use
``grad-attention`` there.

The activations are captured with hooks during one forward (the one that also gives the
attention gradients) and the propagation runs on them in float64, from each layer's own
input and the module weights. Each recomputed layer output, attention map and the logits
are checked against the model's, so a component the propagation does not model fails
loudly instead of giving a wrong answer.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention.masks import combine_masks, padding_to_attention_mask, sliding_window_mask
from ...attention.multihead import MultiHeadAttention
from ...layers.encoder_layer import TransformerEncoderLayer
from ...layers.ffn import PositionWiseFFN
from ...models.classifier import POOLER_ACTIVATIONS, EncoderClassifier
from .gradient_rollout import attention_gradients
from .lrp_rules import (
    add_relevance,
    clone_relevance,
    first_token_relevance,
    linear_relevance,
    matmul_relevance,
    mean_pool_relevance,
)

__all__ = ["AttentionRelevance", "attention_relevance", "check_relevance_support"]

# Relative tolerance of the check that the float64 recomputation is the model's forward.
_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}
_HALF_TOLERANCE = 5e-2


@dataclass
class AttentionRelevance:
    """Every layer's attention map, its gradient and its LRP relevance.

    Attributes:
        attentions: per layer ``[B, H, T, T]`` (detached, the model's dtype).
        gradients: per layer ``[B, H, T, T]``, ``d logits[b, target[b]] / d A``.
        relevances: per layer ``[B, H, T, T]`` float64, the LRP relevance ``R_l`` of the map.
        input_relevance: ``[B, T, E]`` float64, the relevance that reaches the first
            layer's input; each example's total is 1 (the start) less what a score bias
            takes and the rules' stabiliser loses.
        logits: ``[B, C]`` (detached).
        target: ``[B]`` explained class.
    """

    attentions: list[Tensor]
    gradients: list[Tensor]
    relevances: list[Tensor]
    input_relevance: Tensor
    logits: Tensor
    target: Tensor


@dataclass
class _LayerCall:
    """What one encoder layer saw and gave: ``[B, T, E]`` (padded layout) and its masks."""

    x: Tensor
    output: Tensor
    keep: Optional[Tensor]  # broadcastable to [B, H, T, T], True = may attend
    bias: Optional[Tensor]  # additive score term, broadcastable to [B, H, T, T]


@dataclass
class _AttentionForward:
    """The float64 recomputation of one attention module's forward."""

    input: Tensor  # [B, T, E] what the projections read
    q: Tensor  # [B, H, T, D]
    k: Tensor  # [B, H, T, D]
    v: Tensor  # [B, H, T, D]
    scaled_scores: Tensor  # [B, H, T, T] Q K^T / sqrt(D)
    bias: Optional[Tensor]  # [B|1, H|1, T, T]
    weights: Tensor  # [B, H, T, T]
    merged: Tensor  # [B, T, H * D] the output projection's input
    output: Tensor  # [B, T, E]


def _unsupported(component: str, where: str) -> ValueError:
    return ValueError(f"relevance (LRP) does not support {component} ({where}); use grad-attention for this model")


def check_relevance_support(model: nn.Module) -> None:
    """Raise a one-line error naming the first component the LRP propagation does not model.

    Args:
        model: the model to explain.
    """
    if not isinstance(model, EncoderClassifier):
        raise TypeError(
            f"relevance (LRP) starts at the class logits of an attnlab EncoderClassifier, got "
            f"{type(model).__name__}; grad-attention takes any model with [B, C] logits"
        )
    pooler = model.pooler
    if pooler is not None and pooler.norm is not None and not isinstance(pooler.norm, nn.LayerNorm):
        raise _unsupported(type(pooler.norm).__name__, "the pooler's norm")
    for index, layer in enumerate(model.encoder.layers):
        where = f"layer_{index + 1}"
        if type(layer) is not TransformerEncoderLayer:
            raise _unsupported(f"the encoder layer {type(layer).__name__}", where)
        attention = layer.self_attn
        if type(attention) is not MultiHeadAttention:
            names = {
                "DisentangledSelfAttention": "DeBERTa's disentangled attention (DisentangledSelfAttention)",
                "SparseAttention": "sparse attention (SparseAttention)",
            }
            name = type(attention).__name__
            raise _unsupported(names.get(name, f"the attention module {name}"), where)
        if attention.rotary is not None:
            raise _unsupported("rotary position embedding", where)
        if type(layer.ffn) is not PositionWiseFFN:
            name = type(layer.ffn).__name__
            raise _unsupported(f"the feed-forward net {name}" + (" (gated)" if "Gated" in name else ""), where)
        for norm_name in ("norm1", "norm2"):
            if not isinstance(getattr(layer, norm_name), nn.LayerNorm):
                raise _unsupported(f"the norm {type(getattr(layer, norm_name)).__name__}", f"{where}.{norm_name}")


@contextlib.contextmanager
def _record_layers(encoder: nn.Module) -> Iterator[tuple[list[_LayerCall], dict[str, Tensor]]]:
    """Hooks that record each encoder layer call and the encoder's output; removed in ``finally``."""
    calls: list[_LayerCall] = []
    encoded: dict[str, Tensor] = {}

    def on_layer(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
        extra = [name for name in ("attention_mask", "src_mask", "src_key_padding_mask", "head_mask")
                 if kwargs.get(name) is not None] + (["is_causal"] if kwargs.get("is_causal") else [])
        if extra:
            raise _unsupported(f"an encoder layer called with {', '.join(extra)}", "the encoder")
        mask = args[1] if len(args) > 1 else kwargs.get("mask")
        packing = kwargs.get("packing")
        x, out = args[0].detach(), output[0].detach()
        if packing is not None:  # padding skipped: back to [B, T, E], zeros at padding
            x, out = packing.unpack(x), packing.unpack(out)
            mask = combine_masks(mask, padding_to_attention_mask(packing.mask))  # [B, 1, 1, T]
        bias = kwargs.get("attn_bias")
        calls.append(_LayerCall(x, out, mask, None if bias is None else bias.detach()))

    def on_encoder(module: nn.Module, args: tuple, output) -> None:
        encoded["last_hidden_state"] = output[0].detach()

    unique = list({id(layer): layer for layer in encoder.layers}.values())  # a module called twice: one hook
    handles = [layer.register_forward_hook(on_layer, with_kwargs=True) for layer in unique]
    handles.append(encoder.register_forward_hook(on_encoder))
    try:
        yield calls, encoded
    finally:
        for handle in handles:
            handle.remove()


def _check_recomputed(what: str, ours: Tensor, theirs: Tensor, rows: Optional[Tensor] = None) -> None:
    """``ours`` (float64) must be the model's ``theirs`` up to its dtype's rounding.

    ``rows`` (bool, broadcastable to ``ours``) limits the check to real positions: real
    query rows of a map, real tokens of a hidden state.
    """
    reference = theirs.detach().double()
    difference = (ours - reference).abs()
    excess = difference - _TOLERANCE.get(theirs.dtype, _HALF_TOLERANCE) * (1 + reference.abs())
    if rows is not None:
        difference, excess = difference.masked_fill(~rows, 0.0), excess.masked_fill(~rows, 0.0)
    if bool((excess > 0).any()):
        raise RuntimeError(
            f"relevance (LRP): {what} recomputed from the module weights is up to {float(difference.max()):.3g} "
            f"away from the model's own, so the model holds something the propagation does not model; "
            f"use grad-attention"
        )


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    weight = None if norm.weight is None else norm.weight.double()
    bias = None if norm.bias is None else norm.bias.double()
    return F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)


def _linear(x: Tensor, linear: nn.Linear) -> Tensor:
    return F.linear(x, linear.weight.double(), None if linear.bias is None else linear.bias.double())


def _projections(attention: MultiHeadAttention) -> list[tuple[Tensor, Optional[Tensor]]]:
    """``[(weight [H * D, E], bias [H * D] | None)]`` for Q, K and V, in float64."""
    if attention.packed:
        weights = attention.in_proj_weight.double().chunk(3)
    else:
        weights = (attention.q_proj_weight, attention.k_proj_weight, attention.v_proj_weight)
        weights = tuple(weight.double() for weight in weights)
    biases = (None,) * 3 if attention.in_proj_bias is None else attention.in_proj_bias.double().chunk(3)
    return list(zip(weights, biases))


def _split_heads(x: Tensor, heads: int) -> Tensor:
    B, T, _ = x.shape
    return x.view(B, T, heads, -1).transpose(1, 2)  # [B, H, T, D]


def _merge_heads(x: Tensor) -> Tensor:
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)  # [B, T, H * D]


def _attention_forward(
    attention: MultiHeadAttention, x: Tensor, keep: Optional[Tensor], bias: Optional[Tensor]
) -> _AttentionForward:
    """Self-attention of ``x`` ``[B, T, E]`` recomputed in float64, every step kept."""
    T = x.shape[1]
    H, D = attention.num_heads, attention.head_dim
    q, k, v = (_split_heads(F.linear(x, weight, b), H) for weight, b in _projections(attention))  # [B, H, T, D]
    scaled = (q @ k.transpose(-1, -2)) / math.sqrt(D)  # [B, H, T, T]
    bias = None if bias is None else bias.double()
    scores = scaled if bias is None else scaled + bias
    if attention.window is not None:
        local = sliding_window_mask(T, window=attention.window, device=x.device)[None, None]  # [1, 1, T, T]
        keep = combine_masks(keep, local)
    if keep is not None:
        scores = scores.masked_fill(~keep.bool(), float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
    merged = _merge_heads(weights @ v)  # [B, T, H * D]
    return _AttentionForward(x, q, k, v, scaled, bias, weights, merged, _linear(merged, attention.out_proj))


def _attention_relevance(
    attention: MultiHeadAttention, forward: _AttentionForward, relevance: Tensor
) -> tuple[Tensor, list[Tensor]]:
    """``(R_l [B, H, T, T], relevance of the input through Q, K and V, each [B, T, E])``."""
    H = attention.num_heads
    merged = linear_relevance(forward.merged, attention.out_proj.weight.double(), relevance)  # [B, T, H * D]
    relevance_map, relevance_v = matmul_relevance(forward.weights, forward.v, _split_heads(merged, H))
    relevance_scores = relevance_map  # softmax and attention dropout pass it through
    if forward.bias is not None:
        relevance_scores, _ = add_relevance(forward.scaled_scores, forward.bias, relevance_scores)
    relevance_q, relevance_k = matmul_relevance(forward.q, forward.k.transpose(-1, -2), relevance_scores)
    per_projection = (relevance_q, relevance_k.transpose(-1, -2), relevance_v)  # each [B, H, T, D]
    inputs = [
        linear_relevance(forward.input, weight, _merge_heads(part))
        for (weight, _), part in zip(_projections(attention), per_projection)
    ]
    return relevance_map, inputs


def _layer_relevance(
    layer: TransformerEncoderLayer, call: _LayerCall, relevance: Tensor, weights: Tensor, name: str, real: Tensor
) -> tuple[Tensor, Tensor]:
    """``(relevance of the layer's input [B, T, E], R_l [B, H, T, T])`` from its output's relevance."""
    x = call.x.double()
    ffn = layer.ffn
    attended_input = _layer_norm(layer.norm1, x) if layer.norm_first else x
    attention = _attention_forward(layer.self_attn, attended_input, call.keep, call.bias)
    _check_recomputed(f"the attention of {name}", attention.weights, weights, real[:, None, :, None])
    residual = x + attention.output  # post-norm: norm1 follows; pre-norm: this is the stream
    middle = residual if layer.norm_first else _layer_norm(layer.norm1, residual)
    ffn_input = _layer_norm(layer.norm2, middle) if layer.norm_first else middle
    hidden = ffn.activation(_linear(ffn_input, ffn.linear1))
    ffn_output = _linear(hidden, ffn.linear2)
    output = middle + ffn_output if layer.norm_first else _layer_norm(layer.norm2, middle + ffn_output)
    _check_recomputed(f"the output of {name}", output, call.output, real[:, :, None])

    # Backwards; a post-norm layer's norm2 and norm1 pass relevance through.
    relevance_ffn, relevance_middle = add_relevance(ffn_output, middle, relevance)
    relevance_hidden = linear_relevance(hidden, ffn.linear2.weight.double(), relevance_ffn)  # dropout, activation
    relevance_ffn_input = linear_relevance(ffn_input, ffn.linear1.weight.double(), relevance_hidden)
    relevance_middle = clone_relevance(middle, [relevance_ffn_input, relevance_middle])  # pre-norm: norm2 passes
    relevance_attended, relevance_x = add_relevance(attention.output, x, relevance_middle)  # dropout1 passes
    relevance_map, through_projections = _attention_relevance(layer.self_attn, attention, relevance_attended)
    relevance_x = clone_relevance(x, [*through_projections, relevance_x])  # pre-norm: norm1 passes
    return relevance_x, relevance_map


def _head_relevance(model: EncoderClassifier, hidden: Tensor, real: Tensor, logits: Tensor, target: Tensor) -> Tensor:
    """Relevance of the encoder's output ``[B, T, E]``: one-hot on the target, back through
    the classifier, the pooler and the pooling step."""
    hidden = hidden.double()
    if model.pooling == "first":
        pooled = hidden[:, 0]  # [B, E]
    else:
        weights = real.double() / real.double().sum(1, keepdim=True).clamp_min(1.0)  # [B, T]
        pooled = torch.einsum("bt,bte->be", weights, hidden)  # [B, E]
    features = pooled
    if model.pooler is not None:
        features = POOLER_ACTIVATIONS[model.pooler.settings["activation"]](_linear(pooled, model.pooler.dense))
        if model.pooler.norm is not None:
            features = _layer_norm(model.pooler.norm, features)
    _check_recomputed("the logits", _linear(features, model.classifier), logits)

    relevance = F.one_hot(target, logits.shape[-1]).double()  # [B, C]
    relevance = linear_relevance(features, model.classifier.weight.double(), relevance)  # dropout passes
    if model.pooler is not None:  # its norm and activation pass relevance through
        relevance = linear_relevance(pooled, model.pooler.dense.weight.double(), relevance)
    if model.pooling == "first":
        return first_token_relevance(hidden, relevance)
    return mean_pool_relevance(hidden, real, relevance)  # the encoder's final norm passes it through


def attention_relevance(
    model: nn.Module,
    input_ids: Tensor,
    mask: Optional[Tensor] = None,
    target: Optional[Union[int, str]] = None,
) -> AttentionRelevance:
    """Run ``model`` once; LRP relevance, weights and gradient of every attention map.

    Args:
        model: an :class:`~attnlab.EncoderClassifier` (see the module docstring for the
            supported layers; run in eval mode, modes restored).
        input_ids: ``[B, T]``.
        mask: ``[B, T]``, ``True`` on real tokens (default: from the encoder's ``pad_id``,
            else every position).
        target: class index, label name, or ``None`` for each example's prediction.

    Returns:
        :class:`AttentionRelevance`.

    Example:
        >>> found = attention_relevance(model, ids)
        >>> found.relevances[0].shape
        torch.Size([1, 4, 6, 6])
    """
    check_relevance_support(model)
    encoder = model.encoder
    if mask is None:
        mask = encoder.padding_mask_for(input_ids, None)
    real = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    if real.shape != input_ids.shape:
        raise ValueError(f"mask must be a [B, T] padding mask like input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(real.shape)}")
    with _record_layers(encoder) as (calls, encoded):
        found = attention_gradients(model, input_ids, real, target)
    if len(calls) != len(found.attentions):
        raise _unsupported(f"{len(found.attentions)} attention maps from {len(calls)} layer calls", "the encoder")
    with torch.no_grad():
        relevance = _head_relevance(model, encoded["last_hidden_state"], real, found.logits, found.target)
        relevances: list[Tensor] = []
        for index in reversed(range(len(calls))):
            relevance, relevance_map = _layer_relevance(
                encoder.layers[index], calls[index], relevance, found.attentions[index], f"layer_{index + 1}", real
            )
            relevances.insert(0, relevance_map)
    return AttentionRelevance(found.attentions, found.gradients, relevances, relevance, found.logits, found.target)
