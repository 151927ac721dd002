"""Every attribution method on one model and input: one score per token and method.

Dimension letters: ``B`` batch, ``T`` length, ``C`` classes.

Methods (see each module for the exact definition):

========================  =====================================================
``raw``                   last layer's attention of the pooled position, head mean
``rollout``               Abnar & Zuidema's rollout, pooled row (``attention_scores``)
``flow``                  Abnar & Zuidema's attention flow, max-flow (``attention_flow``)
``grad-attention``        Chefer, Gur & Wolf 2021, generic (``gradient_rollout``)
``relevance``             Chefer, Gur & Wolf 2021, CVPR: LRP (``lrp``, ``gradient_rollout``)
``integrated-gradients``  on the token embeddings (``integrated_gradients``)
``attn-lrp``              Achtibat et al. 2024, ICML: AttnLRP of the class logit (``attn_lrp``)
========================  =====================================================

``attn-lrp`` also serves transformers classifiers of the families its rules know
(:mod:`~attnlab.hf.attn_lrp_rules`); the logit it explains and its relevances' sum come with
the scores (``attn_lrp_logit``, ``attn_lrp_sum``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
from torch import Tensor, nn

from .inspectable import inspectable, require
from .attn_lrp import attn_lrp_classifier
from .attention_flow import attention_flow
from .attention_scores import raw_attention_scores, rollout_scores
from .attribution_target import logits_of, query_weights, resolve_target
from .capture import capture_attention
from .gradient_rollout import attention_gradients, gradient_weighted_rollout
from .integrated_gradients import integrated_gradients
from .integrated_gradients_baseline import DEFAULT_BASELINE, check_baseline
from .lrp import attention_relevance

__all__ = ["METHODS", "DEFAULT_METHODS", "GRADIENT_METHODS", "TokenAttributions", "attribute_tokens",
           "check_methods"]

DEFAULT_METHODS = ("raw", "rollout", "flow", "grad-attention", "relevance", "integrated-gradients")
METHODS = DEFAULT_METHODS + ("attn-lrp",)
GRADIENT_METHODS = ("grad-attention", "relevance", "integrated-gradients", "attn-lrp")


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` as a list without repeats; unknown names are refused."""
    if isinstance(methods, str):
        methods = [methods]
    unknown = [name for name in methods if name not in METHODS]
    if unknown:
        raise ValueError(f"unknown attribution method {unknown[0]!r}; choose among {', '.join(METHODS)}")
    if not methods:
        raise ValueError(f"name at least one method among {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


@dataclass
class TokenAttributions:
    """Scores per method for a batch of inputs.

    Attributes:
        scores: ``{method: [B, T]}`` in the order asked.
        target: ``[B]`` explained class, or ``None`` for a model without logits.
        logits: ``[B, C]`` or ``None``.
        delta: ``[B]`` integrated gradients' completeness error, when it ran.
        attn_lrp_logit: ``[B]`` the class logit ``attn-lrp`` explains, when it ran.
        attn_lrp_sum: ``[B]`` the sum of its relevances (``attn_lrp_sum - attn_lrp_logit``:
            what the model's biases and the softmax's rule absorbed).
    """

    scores: dict[str, Tensor] = field(default_factory=dict)
    target: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    delta: Optional[Tensor] = None
    attn_lrp_logit: Optional[Tensor] = None
    attn_lrp_sum: Optional[Tensor] = None


def attribute_tokens(
    model: nn.Module,
    input_ids: Tensor,
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    mask: Optional[Tensor] = None,
    target: Optional[Union[int, str]] = None,
    baseline_ids: Optional[Tensor] = None,
    baseline: str = DEFAULT_BASELINE,
    steps: int = 50,
    residual_weight: float = 0.5,
) -> TokenAttributions:
    """One score per token for each method, for the predicted (or given) class.

    Args:
        model: an attnlab classifier (all methods; ``relevance`` needs an
            ``EncoderClassifier`` whose layers :mod:`~attnlab.inspect.compute.lrp` supports,
            ``attn-lrp`` one whose modules :mod:`~attnlab.inspect.compute.attn_lrp_rules` knows)
            or bare encoder (``raw``, ``rollout``, ``flow``), run in eval mode.
        input_ids: ``[B, T]``; explain unpadded texts (one at a time) for the gradient methods.
        methods: names from :data:`METHODS` (default: :data:`DEFAULT_METHODS`, every one but
            ``attn-lrp``).
        mask: ``[B, T]``, ``True`` on real tokens (default: every position).
        target: class index, label name, or ``None`` for the prediction.
        baseline_ids: integrated gradients' reference input (default: pad ids).
        baseline: integrated gradients' baseline: ``"pad"`` (the embeddings of ``baseline_ids``),
            ``"zero"`` or ``"mean"`` (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).
        steps: integrated gradients' quadrature points.
        residual_weight: rollout's and flow's attention share against the residual.

    Returns:
        :class:`TokenAttributions`.
    """
    methods = check_methods(methods)
    check_baseline(baseline)
    require(inspectable(model), "one_sequence", "explain")
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be a [B, T] tensor, got {getattr(input_ids, 'shape', type(input_ids))}"
        )
    keep = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    weights = query_weights(model, keep)  # [B, T]
    result = TokenAttributions()
    attentions = None
    if any(name in methods for name in ("raw", "rollout", "flow")) or not any(
        name in methods for name in GRADIENT_METHODS
    ):
        with torch.no_grad(), capture_attention(model) as captured:
            output = model(input_ids, mask=keep)
        attentions = [captured.attentions[name] for name in captured.paths]
        try:
            result.logits = logits_of(output)
            result.target = resolve_target(result.logits, target, getattr(model, "label_names", None))
        except TypeError:
            if target is not None:
                raise
    gradients = relevance = None
    if "relevance" in methods:  # one forward gives the relevance and grad-attention's gradients
        gradients = relevance = attention_relevance(model, input_ids, keep, target)
    elif "grad-attention" in methods:
        gradients = attention_gradients(model, input_ids, keep, target)
    if gradients is not None:
        result.logits, result.target = gradients.logits, gradients.target
    for name in methods:
        if name == "raw":
            result.scores[name] = raw_attention_scores(attentions, weights)
        elif name == "rollout":
            result.scores[name] = rollout_scores(attentions, weights, keep, residual_weight=residual_weight)
        elif name == "flow":
            result.scores[name] = attention_flow(attentions, weights, keep, residual_weight=residual_weight)
        elif name == "grad-attention":
            result.scores[name] = gradient_weighted_rollout(gradients.attentions, gradients.gradients, weights)
        elif name == "relevance":
            result.scores[name] = gradient_weighted_rollout(relevance.relevances, relevance.gradients, weights)
        elif name == "attn-lrp":
            explained = attn_lrp_classifier(model, input_ids, keep, target)
            result.scores[name] = explained.scores.float()
            result.attn_lrp_logit, result.attn_lrp_sum = explained.logit.float(), explained.total.float()
            result.logits, result.target = explained.logits, explained.target
        else:
            integrated = integrated_gradients(
                model, input_ids, target=target, baseline_ids=baseline_ids, baseline=baseline, mask=keep,
                steps=steps,
            )
            result.scores[name] = integrated.scores
            result.delta, result.target = integrated.delta, integrated.target
    return result
