"""Which earlier tokens made a language model write each generated token: every method at once.

Dimension letters: ``L`` layers, ``H`` heads, ``N`` sequence length (prompt + generated),
``P`` prompt length, ``G = N - P`` explained tokens.

Generated token ``g`` is predicted at position ``p_g = P + g - 1``; each method gives one
score to every position ``0 .. p_g`` (the prompt and the tokens generated before it) and 0
to later ones. What is explained is the objective of
:mod:`~attnlab.inspect.compute.next_token_objective` (the token's log-probability, or its
difference with a foil's for a contrastive question).

========================  =====================================================
``raw``                   row ``p_g`` of the last layer's attention, mean over heads
``rollout``               row ``p_g`` of Abnar & Zuidema's rollout (:mod:`.rollout`)
``grad-attention``        Chefer et al.'s gradient-weighted rollout of the objective (:mod:`.gradient_rollout`)
``integrated-gradients``  on the token embeddings (:mod:`.generation_integrated_gradients`)
``occlusion``             the objective's drop when the token is replaced by a neutral one (:mod:`.occlusion`)
``attn-lrp``              AttnLRP (Achtibat et al. 2024) of the token's logit (:mod:`.attn_lrp`)
========================  =====================================================

``attn-lrp`` explains the token's **logit** (minus the foil's, for a contrastive question),
not its log-probability: AttnLRP's relevance starts at a logit. The logit difference with a
foil equals the difference of log-probabilities; a plain question's logit differs from its
log-probability by the softmax's normaliser, which the method does not explain. The explained
logits and the relevances' sums come with the scores (``attn_lrp_logit``, ``attn_lrp_sum``).

``raw`` and ``rollout`` read attention only, so a contrastive question gets the same
scores as the plain one from them (the page and the JSON say so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .attn_lrp import attn_lrp_generation
from .inspectable import inspectable, require
from .modes import eval_mode
from .capture import capture_attention
from .generation_integrated_gradients import generation_integrated_gradients
from .integrated_gradients_baseline import DEFAULT_BASELINE, check_baseline
from .gradient_rollout import gradient_weighted_rollout
from .next_token_objective import check_sequence, decoder_logits, explained_positions, next_token_objective
from .occlusion import occlusion_scores
from .rollout import attention_rollout

__all__ = ["GENERATION_METHODS", "DEFAULT_GENERATION_METHODS", "ATTENTION_ONLY_METHODS",
           "GenerationAttributions", "attribute_generation", "check_generation_methods"]

DEFAULT_GENERATION_METHODS = ("raw", "rollout", "grad-attention", "integrated-gradients", "occlusion")
GENERATION_METHODS = DEFAULT_GENERATION_METHODS + ("attn-lrp",)
ATTENTION_ONLY_METHODS = ("raw", "rollout")


def check_generation_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` without repeats; unknown names are refused."""
    if isinstance(methods, str):
        methods = [methods]
    unknown = [name for name in methods if name not in GENERATION_METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r} for generated text; choose among "
                         f"{', '.join(GENERATION_METHODS)}")
    if not methods:
        raise ValueError(f"name at least one method among {', '.join(GENERATION_METHODS)}")
    return list(dict.fromkeys(methods))


@dataclass
class GenerationAttributions:
    """Scores of one sequence.

    Attributes:
        scores: ``{method: [G, N]}``; row ``g`` scores positions ``0 .. P + g - 1``.
        prompt_length: ``P``.
        objective: ``[G]`` the explained quantity (log-probability, or the difference with the foil's).
        foil_ids: ``[G]`` contrast tokens, or ``None``.
        delta: ``[G]`` integrated gradients' completeness error, when it ran.
        attn_lrp_logit: ``[G]`` the logit (difference) ``attn-lrp`` explains, when it ran.
        attn_lrp_sum: ``[G]`` the sum of its relevances: ``attn_lrp_sum - attn_lrp_logit`` is
            what the model's biases and the softmax's rule absorbed.
    """

    scores: dict[str, Tensor] = field(default_factory=dict)
    prompt_length: int = 0
    objective: Optional[Tensor] = None
    foil_ids: Optional[Tensor] = None
    delta: Optional[Tensor] = None
    attn_lrp_logit: Optional[Tensor] = None
    attn_lrp_sum: Optional[Tensor] = None


def _attention_rows(model: nn.Module, input_ids: Tensor, keep_graph: bool):
    """Every layer's ``[1, H, N, N]`` weights (and the logits), through :func:`capture_attention`."""
    with capture_attention(model, detach=not keep_graph) as captured:
        logits = decoder_logits(model, input_ids)
    weights = [captured.attentions[name] for name in captured.paths]
    if not weights:
        raise ValueError(f"{type(model).__name__}: no attention module answered need_weights; the attention "
                         f"methods need attnlab's decoder or a model opened through transformers")
    return logits, weights


def attribute_generation(
    model: nn.Module,
    input_ids: Tensor,
    prompt_length: int,
    methods: Sequence[str] = DEFAULT_GENERATION_METHODS,
    *,
    foil_ids: Optional[Tensor] = None,
    neutral_id: int = 0,
    baseline_ids: Optional[Tensor] = None,
    baseline: str = DEFAULT_BASELINE,
    steps: int = 50,
    residual_weight: float = 0.5,
) -> GenerationAttributions:
    """One score per earlier token for each generated token, by each method.

    Args:
        model: a decoder: attnlab's :class:`~attnlab.models.decoder.DecoderForCausalLM` or a
            :class:`~attnlab.hf.opening.TransformersModel` language model; run in eval mode.
        input_ids: ``[1, N]`` prompt then generated (or given) tokens.
        prompt_length: ``P``: tokens after it are explained.
        methods: names from :data:`GENERATION_METHODS` (default: :data:`DEFAULT_GENERATION_METHODS`,
            every one but ``attn-lrp``).
        foil_ids: ``[G]`` (or an int for every token): explain ``log p(target) - log p(foil)``.
        neutral_id: the token occlusion puts in place of a token, and integrated
            gradients' baseline at every position (unless ``baseline_ids``).
        baseline_ids: ``[1, N]`` integrated gradients' reference input.
        baseline: integrated gradients' baseline: ``"pad"`` (the neutral token's embedding),
            ``"zero"`` or ``"mean"`` (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).
        steps: integrated gradients' quadrature points.
        residual_weight: rollout's attention share against the residual.

    Returns:
        :class:`GenerationAttributions`.

    Example:
        >>> ids = torch.tensor([[5, 9, 3, 7]])      # 3 prompt tokens, 1 generated
        >>> attribute_generation(model, ids, 3, ["occlusion"]).scores["occlusion"].shape
        torch.Size([1, 4])
    """
    methods = check_generation_methods(methods)
    check_baseline(baseline)
    require(inspectable(model), "one_sequence", "explaining generated tokens")
    N, P = check_sequence(input_ids, prompt_length)
    G = N - P
    if isinstance(foil_ids, int):
        foil_ids = torch.full((G,), foil_ids, dtype=torch.long)
    if foil_ids is not None and tuple(foil_ids.shape) != (G,):
        raise ValueError(f"foil_ids must hold one token per generated token ({G}), got {tuple(foil_ids.shape)}")
    positions = explained_positions(N, P)  # [G]
    result = GenerationAttributions(prompt_length=P, foil_ids=foil_ids)
    with eval_mode(model):
        if any(name in methods for name in ATTENTION_ONLY_METHODS):
            with torch.no_grad():
                logits, weights = _attention_rows(model, input_ids, keep_graph=False)
            result.objective = next_token_objective(logits, input_ids, P, foil_ids)[0]
            if "raw" in methods:
                last = weights[-1][0].float().mean(0)  # [N, N]
                result.scores["raw"] = _visible(last[positions], positions)
            if "rollout" in methods:
                rollout = attention_rollout(weights, residual_weight=residual_weight)[-1, 0]  # [N, N]
                result.scores["rollout"] = _visible(rollout[positions], positions)
        if "grad-attention" in methods:
            result.scores["grad-attention"] = _grad_attention(model, input_ids, P, foil_ids)
        if "integrated-gradients" in methods:
            if baseline_ids is None and baseline == "pad":
                baseline_ids = torch.full_like(input_ids, neutral_id)
            integrated = generation_integrated_gradients(model, input_ids, P, baseline_ids=baseline_ids,
                                                         baseline=baseline, foil_ids=foil_ids, steps=steps)
            result.scores["integrated-gradients"], result.delta = integrated.scores, integrated.delta
        if "occlusion" in methods:
            result.scores["occlusion"] = occlusion_scores(model, input_ids, P, neutral_id=neutral_id,
                                                          foil_ids=foil_ids)
        if "attn-lrp" in methods:
            relevance = attn_lrp_generation(model, input_ids, P, foil_ids)
            result.scores["attn-lrp"] = _visible(relevance.scores, positions)
            result.attn_lrp_logit = relevance.logit.float().cpu()
            result.attn_lrp_sum = relevance.total.float().cpu()
        if result.objective is None:
            with torch.no_grad():
                result.objective = next_token_objective(decoder_logits(model, input_ids), input_ids, P, foil_ids)[0]
    result.scores = {name: result.scores[name] for name in methods}
    return result


def _visible(rows: Tensor, positions: Tensor) -> Tensor:
    """``[G, N]`` rows with the positions after each predicting position set to 0."""
    N = rows.shape[-1]
    keep = torch.arange(N)[None, :] <= positions[:, None]
    return torch.where(keep, rows.float().cpu(), 0.0)


def _grad_attention(model: nn.Module, input_ids: Tensor, P: int, foil_ids: Optional[Tensor]) -> Tensor:
    """Chefer et al.'s rule, one backward per generated token through one forward pass."""
    N = input_ids.shape[1]
    positions = explained_positions(N, P)
    with torch.enable_grad():
        logits, weights = _attention_rows(model, input_ids, keep_graph=True)
        objective = next_token_objective(logits, input_ids, P, foil_ids)[0]  # [G]
        rows = []
        for g, position in enumerate(positions.tolist()):
            gradients = torch.autograd.grad(objective[g], weights, retain_graph=g < len(positions) - 1,
                                            allow_unused=True)
            gradients = [torch.zeros_like(w) if d is None else d for w, d in zip(weights, gradients)]
            query = torch.zeros(1, N)
            query[0, position] = 1.0
            rows.append(gradient_weighted_rollout([w.detach() for w in weights], gradients, query)[0])
    return _visible(torch.stack(rows), positions)
