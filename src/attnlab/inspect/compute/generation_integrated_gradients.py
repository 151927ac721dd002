"""Integrated gradients of generated tokens, on the token embeddings of a decoder.

Dimension letters: ``N`` sequence length, ``P`` prompt length, ``G`` generated tokens,
``E`` model dim, ``K`` integration points.

For generated token ``g`` the input is the prefix ``ids[:P + g]`` and the output its
objective (:mod:`~attnlab.inspect.compute.next_token_objective`: log-probability, or the
difference with a foil's). The path runs from a baseline
(:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`: the embeddings of
``baseline_ids``, the zero vector or the mean embedding) to the embeddings of ``ids`` at
the output of the token embedding (positions stay as they are, as captum's
``LayerIntegratedGradients`` on a GPT-2's ``wte``), with ``K``-point Gauss-Legendre
quadrature (captum's default), so the numbers equal captum's on the same prefix.

A causal model's position ``P + g - 1`` sees only the prefix, so one path over the whole
sequence serves every generated token: each point is one forward pass and one backward
per generated token (the graph kept between them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from .integrated_gradients_baseline import DEFAULT_BASELINE, baseline_embeddings, check_baseline
from .next_token_objective import (check_sequence, decoder_logits, explained_positions, next_token_objective,
                                   token_embedding_module)

__all__ = ["GenerationIntegratedGradients", "generation_integrated_gradients"]


@dataclass
class GenerationIntegratedGradients:
    """Attributes:
        scores: ``[G, N]`` per-token attributions (summed over the embedding; zeros after
            the predicting position).
        delta: ``[G]`` completeness error ``sum(scores_g) - (objective_g(x) - objective_g(x'))``.
    """

    scores: Tensor
    delta: Tensor


def _logits_at(model: nn.Module, embedding: nn.Module, input_ids: Tensor, embeddings: Tensor) -> Tensor:
    """``[k, N, V]`` logits with the token embedding's output replaced by ``embeddings`` ``[k, N, E]``."""

    def replace(module, args, output):
        return embeddings

    handle = embedding.register_forward_hook(replace)
    try:
        return decoder_logits(model, input_ids.repeat(embeddings.shape[0], 1))
    finally:
        handle.remove()


def generation_integrated_gradients(
    model: nn.Module,
    input_ids: Tensor,
    prompt_length: int,
    *,
    baseline_ids: Optional[Tensor] = None,
    baseline: str = DEFAULT_BASELINE,
    foil_ids: Optional[Tensor] = None,
    steps: int = 50,
    internal_batch: int = 16,
) -> GenerationIntegratedGradients:
    """Integrated gradients of every generated token's objective.

    Args:
        model: a decoder (attnlab's, or a transformers causal LM), in eval mode.
        input_ids: ``[1, N]`` prompt then generated tokens.
        prompt_length: ``P``.
        baseline_ids: ``[1, N]`` the reference input (e.g. a neutral token everywhere), embedded
            by ``baseline="pad"`` (which needs it); under ``"zero"`` and ``"mean"`` the positions
            where it equals ``input_ids`` keep the input's embedding (``None``: none do).
        baseline: ``"pad"``, ``"zero"`` or ``"mean"``
            (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).
        foil_ids: ``[G]`` contrast tokens, or ``None``.
        steps: quadrature points ``K``.
        internal_batch: path points per forward pass.

    Returns:
        :class:`GenerationIntegratedGradients`.
    """
    N, P = check_sequence(input_ids, prompt_length)
    check_baseline(baseline)
    if baseline_ids is not None and baseline_ids.shape != input_ids.shape:
        raise ValueError(f"baseline_ids must match input_ids {tuple(input_ids.shape)}, "
                         f"got {tuple(baseline_ids.shape)}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    G = N - P
    embedding = token_embedding_module(model)
    points, weights = np.polynomial.legendre.leggauss(steps)
    alphas = torch.tensor(0.5 * (points + 1.0))  # [K] in (0, 1)
    weights = torch.tensor(0.5 * weights)  # [K], summing to 1
    keep = None if baseline_ids is None else baseline_ids == input_ids
    start = baseline_embeddings(embedding, input_ids, baseline, baseline_ids=baseline_ids,
                                keep=keep)  # [1, N, E]
    with torch.no_grad():
        end = embedding(input_ids)  # [1, N, E]
        at_baseline = _logits_at(model, embedding, input_ids, start)  # [1, N, V]
        gain = (next_token_objective(decoder_logits(model, input_ids), input_ids, P, foil_ids)
                - next_token_objective(at_baseline, input_ids, P, foil_ids))[0]  # [G]
    total = torch.zeros(G, N, start.shape[-1], dtype=torch.float64)
    for chunk in torch.arange(steps).split(max(1, internal_batch)):
        k = len(chunk)
        alpha = alphas[chunk].to(start.dtype)[:, None, None]  # [k, 1, 1]
        path = (start + alpha * (end - start)).detach().requires_grad_(True)  # [k, N, E]
        with torch.enable_grad():
            objective = next_token_objective(_logits_at(model, embedding, input_ids, path), input_ids, P,
                                             foil_ids)  # [k, G]
            for g in range(G):
                (gradient,) = torch.autograd.grad(objective[:, g].sum(), path, retain_graph=g < G - 1)
                total[g] += (weights[chunk][:, None, None] * gradient.double()).sum(0)
    attributions = (end - start).double()[0] * total  # [G, N, E]
    scores = attributions.sum(-1)  # [G, N]
    visible = torch.arange(N)[None, :] <= explained_positions(N, P)[:, None]  # [G, N]
    scores = torch.where(visible, scores, 0.0)
    delta = scores.sum(-1) - gain.double()
    return GenerationIntegratedGradients(scores.float(), delta.float())
