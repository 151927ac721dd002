"""attnlab's explain methods on a transformers classifier, through the backend.

Dimension letters: ``B`` batch, ``T`` length, ``C`` classes.

attnlab's attribution methods (:func:`attnlab.inspect.attribute_tokens`) take a model
called as ``model(input_ids, mask=...)`` whose attention modules answer
``need_weights``: a :class:`~attnlab.hf.opening.TransformersModel`, which gives the call and
what the methods read around it (the pooled position, the label names, the token
embedding), so ``raw``, ``rollout``, ``flow``, ``grad-attention`` and
``integrated-gradients`` run unchanged, and ``attn-lrp`` (AttnLRP) on the families its rules
know (:mod:`attnlab.hf.attn_lrp_rules`). ``relevance`` (Chefer et al.'s layer-wise relevance
propagation) needs attnlab's own layers and is refused.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from torch import Tensor, nn

from ..inspect.compute.inspectable import inspectable
from ..inspect.compute.integrated_gradients_baseline import DEFAULT_BASELINE
from ..inspect.compute.token_attribution import METHODS, TokenAttributions, attribute_tokens, check_methods
from .opening import TransformersModel

__all__ = ["TransformersClassifier", "explain_tokens"]


# The classifier wrapper explain_tokens once had is the one wrapper every transformers model
# has now: called as attnlab's models are, pooling its first token unless it is causal.
TransformersClassifier = TransformersModel


def explain_tokens(
    model: nn.Module,
    input_ids: Tensor,
    methods: Sequence[str] = ("raw", "rollout", "flow", "grad-attention", "integrated-gradients"),
    *,
    attention_mask: Optional[Tensor] = None,
    target: Optional[Union[int, str]] = None,
    steps: int = 50,
    baseline: str = DEFAULT_BASELINE,
) -> TokenAttributions:
    """One score per token and method for a transformers sequence classifier.

    Args:
        model: a transformers ``*ForSequenceClassification`` whose attention goes through
            ``transformers.AttentionInterface``.
        input_ids: ``[B, T]``.
        methods: among ``raw``, ``rollout``, ``flow``, ``grad-attention``,
            ``integrated-gradients``, ``attn-lrp``.
        attention_mask: ``[B, T]``, 1 on real tokens.
        target: class index or label name; default the prediction.
        steps: integrated gradients' quadrature points.
        baseline: integrated gradients' baseline: ``"pad"``, ``"zero"`` or ``"mean"``
            (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).

    Returns:
        :class:`~attnlab.inspect.TokenAttributions`, the numbers attnlab's own model of the
        same weights gives.
    """
    methods = check_methods(methods)
    if "relevance" in methods:
        supported = ", ".join(name for name in METHODS if name != "relevance")
        raise ValueError(f"relevance (LRP) needs attnlab's own layers; on a transformers model choose among {supported}")
    return attribute_tokens(inspectable(model), input_ids, methods, mask=attention_mask, target=target,
                            steps=steps, baseline=baseline)
