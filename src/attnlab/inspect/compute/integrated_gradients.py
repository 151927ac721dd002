"""Integrated gradients on the token embeddings (Sundararajan, Taly & Yan, 2017).

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``K`` integration steps.

The path runs from a baseline (:mod:`.integrated_gradients_baseline`: the embeddings of
``baseline_ids``, the zero vector or the mean embedding) to the embeddings of ``input_ids``
at the output of the encoder's token embedding (positions and token types stay as they are,
as in captum's ``LayerIntegratedGradients`` on a BERT's word embeddings):
``IG = (x - x') * integral_0^1 d y_c(x' + a (x - x')) / dx da``, summed over ``E`` for a
token's score. The integral uses ``K``-point Gauss-Legendre quadrature, captum's
default, so ``backend="captum"`` (the ``explain`` extra) gives the same numbers; the
scores sum to ``y_c(x) - y_c(x')`` up to the quadrature error (``delta``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from .modes import eval_mode
from .attribution_target import logits_of, resolve_target, token_embedding_of
from .integrated_gradients_baseline import DEFAULT_BASELINE, baseline_embeddings, check_baseline

__all__ = ["IntegratedGradients", "integrated_gradients", "BACKENDS", "MAX_STEPS"]

# Gauss-Legendre points come from a K x K eigenproblem (K = 10**5 asks numpy for 74.5 GiB);
# far fewer points already integrate a model's smooth path to float32 precision.
MAX_STEPS = 1000

BACKENDS = ("attnlab", "captum")


@dataclass
class IntegratedGradients:
    """What :func:`integrated_gradients` returns.

    Attributes:
        scores: ``[B, T]`` per-token attributions (summed over the embedding).
        attributions: ``[B, T, E]``.
        target: ``[B]`` explained class.
        delta: ``[B]`` ``sum(scores) - (y_c(x) - y_c(x'))``, the quadrature error.
    """

    scores: Tensor
    attributions: Tensor
    target: Tensor
    delta: Tensor


def _forward(model: nn.Module, input_ids: Tensor, mask: Optional[Tensor]) -> Tensor:
    with warnings.catch_warnings():
        # the baseline is pad ids under the input's mask on purpose: the encoder's warning
        # about a mask that calls pad ids real tokens does not apply
        warnings.filterwarnings("ignore", message=r".*holding pad_id=", category=UserWarning)
        return logits_of(model(input_ids) if mask is None else model(input_ids, mask=mask))


def _forward_at(model: nn.Module, embedding: nn.Module, input_ids: Tensor, mask: Optional[Tensor],
               embeddings: Tensor) -> Tensor:
    """Logits with the token embedding's output replaced by ``embeddings`` ``[B', T, E]``
    (``B'`` a multiple of ``B``: ids and mask are repeated to match)."""
    repeats = embeddings.shape[0] // input_ids.shape[0]

    def replace(module, args, output):
        return embeddings

    handle = embedding.register_forward_hook(replace)
    try:
        repeated_mask = None if mask is None else mask.repeat(repeats, 1)
        return _forward(model, input_ids.repeat(repeats, 1), repeated_mask)
    finally:
        handle.remove()


def _ours(model, embedding, input_ids, start, end, mask, target, steps, internal_batch) -> Tensor:
    B, T = input_ids.shape
    points, weights = np.polynomial.legendre.leggauss(steps)
    alphas = torch.tensor(0.5 * (points + 1.0))  # [K] in (0, 1)
    weights = torch.tensor(0.5 * weights)  # [K], summing to 1
    total = torch.zeros(start.shape, dtype=torch.float64)
    for chunk in torch.arange(steps).split(max(1, internal_batch // max(B, 1))):
        k = len(chunk)
        alpha = alphas[chunk].to(start.dtype)[:, None, None, None]  # [k, 1, 1, 1]
        path = (
            (start + alpha * (end - start)).reshape(k * B, T, -1).detach().requires_grad_(True)
        )  # [kB, T, E]
        with torch.enable_grad():
            logits = _forward_at(model, embedding, input_ids, mask, path)
            chosen = logits.gather(1, target.repeat(k)[:, None]).sum()
            (gradient,) = torch.autograd.grad(chosen, path)
        gradient = gradient.double().reshape(k, B, T, -1)  # [k, B, T, E]
        total += (weights[chunk][:, None, None, None] * gradient).sum(0)
    return (end - start).double() * total  # [B, T, E]


def _captum(model, embedding, input_ids, baseline_ids, start, end, baseline, mask, target, steps,
            internal_batch) -> Tensor:
    try:
        from captum.attr import IntegratedGradients as CaptumIntegratedGradients, LayerIntegratedGradients
    except ImportError as error:
        raise ImportError("backend='captum' needs captum: pip install 'attnlab[explain]'") from error

    if baseline == "pad":  # token ids in, the layer's attributions out: captum's usual way
        def forward(ids: Tensor) -> Tensor:
            repeats = ids.shape[0] // input_ids.shape[0]
            return _forward(model, ids, None if mask is None else mask.repeat(repeats, 1))

        method, inputs, baselines = LayerIntegratedGradients(forward, embedding), input_ids, baseline_ids
    else:  # a baseline that is no token's embedding: integrate over the embeddings themselves
        def forward(embeddings: Tensor) -> Tensor:
            return _forward_at(model, embedding, input_ids, mask, embeddings)

        method, inputs, baselines = CaptumIntegratedGradients(forward), end, start
    with torch.enable_grad():
        attributions = method.attribute(
            inputs,
            baselines=baselines,
            target=target,
            n_steps=steps,
            internal_batch_size=internal_batch,
        )
    return attributions.detach().double()


def integrated_gradients(
    model: nn.Module,
    input_ids: Tensor,
    *,
    target: Optional[Union[int, str, Tensor, list[int]]] = None,
    baseline_ids: Optional[Tensor] = None,
    baseline: str = DEFAULT_BASELINE,
    mask: Optional[Tensor] = None,
    steps: int = 50,
    internal_batch: int = 64,
    backend: str = "attnlab",
) -> IntegratedGradients:
    """Integrated gradients of the target logit with respect to the token embeddings.

    Args:
        model: a classifier built on an attnlab :class:`~attnlab.TransformerEncoder`.
        input_ids: ``[B, T]``.
        target: class index, label name, one class per example (a ``[B]`` tensor or
            list, as captum takes), or ``None`` for each example's prediction.
        baseline_ids: ``[B, T]`` ids of the reference input; default the pad id at every
            position (keep ``[CLS]``/``[SEP]`` there to explain only the words).
        baseline: ``"pad"`` (the embeddings of ``baseline_ids``), ``"zero"`` or ``"mean"``
            (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`); under the last two
            the positions where ``baseline_ids`` equal ``input_ids`` keep the input's embedding.
        mask: ``[B, T]``, ``True`` on real tokens.
        steps: quadrature points ``K``, at most :data:`MAX_STEPS` (50-300 is usual).
        internal_batch: at most this many path points per forward pass.
        backend: ``"attnlab"`` (this module) or ``"captum"`` (``LayerIntegratedGradients``).

    Returns:
        :class:`IntegratedGradients`.

    Shape:
        ``input_ids``, ``baseline_ids``, ``mask`` ``[B, T]`` -> ``scores`` ``[B, T]``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_baseline(baseline)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if steps > MAX_STEPS:
        raise ValueError(f"steps={steps} is more than {MAX_STEPS} quadrature points (the points alone would need "
                         f"steps x steps floats); 50-300 integrate to float32 precision")
    embedding, pad_id = token_embedding_of(model)
    if baseline_ids is None:
        baseline_ids = torch.full_like(input_ids, pad_id if pad_id is not None else 0)
    if mask is None:  # the input's own padding, also for the baseline (all pad ids)
        mask = input_ids != pad_id if pad_id is not None else None
    if baseline_ids.shape != input_ids.shape:
        raise ValueError(
            f"baseline_ids must match input_ids {tuple(input_ids.shape)}, got {tuple(baseline_ids.shape)}"
        )
    start = baseline_embeddings(embedding, input_ids, baseline, baseline_ids=baseline_ids,
                                keep=baseline_ids == input_ids)  # [B, T, E]
    with torch.no_grad():
        end = embedding(input_ids)  # [B, T, E]
    with eval_mode(model):
        with torch.no_grad():
            logits = _forward(model, input_ids, mask)
            target = resolve_target(logits, target, getattr(model, "label_names", None))
            baseline_logits = _forward_at(model, embedding, input_ids, mask, start)
        if backend == "attnlab":
            attributions = _ours(model, embedding, input_ids, start, end, mask, target, steps, internal_batch)
        else:
            attributions = _captum(model, embedding, input_ids, baseline_ids, start, end, baseline, mask,
                                   target, steps, internal_batch)
    scores = attributions.sum(-1)  # [B, T]
    gain = (logits.gather(1, target[:, None]) - baseline_logits.gather(1, target[:, None]))[:, 0]
    delta = scores.sum(-1) - gain.double()
    return IntegratedGradients(scores.float(), attributions.float(), target, delta.float())
