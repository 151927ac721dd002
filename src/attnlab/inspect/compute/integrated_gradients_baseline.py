"""Where integrated gradients' path starts: the baseline, at the token embedding's output.

Dimension letters: ``B`` batch, ``T`` length, ``E`` model dim, ``V`` vocabulary.

Three baselines, all taken at the *output* of the token-embedding module (so a model that
scales its embeddings inside that module, as Gemma's ``ScaledWordEmbedding`` does, gets the
scaled vectors, and "zero" is the zero vector the rest of the model actually sees):

=========  ===================================================================
``pad``    the embedding of a token: the pad id for a classifier, the neutral token
           (pad, else end-of-text) for generated text: what ``baseline_ids`` hold
``zero``   the zero vector
``mean``   the mean of the embedding's outputs over the whole vocabulary (the average token)
=========  ===================================================================

Positions marked ``keep`` (a classifier's ``[CLS]``/``[SEP]``, where ``baseline_ids`` equal
the input's) keep the input's embedding under every baseline, so only the words are
explained. Which one is the default is measured (``benchmarks/ig_baselines.py``; the
figures are in :data:`DEFAULT_BASELINE`'s note and in docs/design.md): ``pad``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

__all__ = ["BASELINES", "DEFAULT_BASELINE", "baseline_embeddings", "check_baseline", "mean_embedding"]

BASELINES = ("pad", "zero", "mean")

DEFAULT_BASELINE = "pad"
"""The baseline used when none is named: the most faithful in ``benchmarks/ig_baselines.py``
(rough figures, 2 shared cores). Deletion AOPC, higher is more faithful: the demo classifier
(20 texts, p(class)) pad 0.605, zero 0.605 (the same path: its pad row is zero), mean 0.600,
random 0.127, all under 5 % at 50 points; SmolLM2 (4 prompts, 50 points, log p in nats) pad
3.30, mean 2.73, zero 1.41 (below random's 2.38: the zero vector is RMSNorm's singular point),
none under 5 % at 50 points (gaps 1374 %, 1002 %, 130 %). docs/design.md has the table."""

# ids embedded per call when averaging a vocabulary (Gemma's 262,144 rows at 640 floats: 10 MiB a chunk)
_MEAN_CHUNK = 4096


def check_baseline(baseline: Any, argument: str = "baseline") -> str:
    """``baseline`` if it names one of :data:`BASELINES`, else a one-line ``ValueError``."""
    if not isinstance(baseline, str) or baseline not in BASELINES:
        raise ValueError(f"{argument} must be one of {', '.join(BASELINES)} (integrated gradients' "
                         f"starting point: a pad token's embedding, the zero vector, the mean embedding), "
                         f"got {baseline!r}")
    return baseline


def mean_embedding(embedding: nn.Module) -> Tensor:
    """``[E]`` the mean of ``embedding``'s outputs over its whole vocabulary (in chunks, summed in float64).

    For a plain ``nn.Embedding`` this is the mean of the weight's rows; a module that scales
    its output (Gemma) gives the scaled mean.
    """
    weight = getattr(embedding, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"the mean baseline needs a token embedding with a [V, E] weight, got "
                         f"{type(embedding).__name__}")
    V = weight.shape[0]
    total = torch.zeros(weight.shape[1], dtype=torch.float64, device=weight.device)
    with torch.no_grad():
        for start in range(0, V, _MEAN_CHUNK):
            ids = torch.arange(start, min(start + _MEAN_CHUNK, V), device=weight.device)[None]  # [1, chunk]
            total += embedding(ids)[0].double().sum(0)
    return (total / V).to(weight.dtype)


def baseline_embeddings(embedding: nn.Module, input_ids: Tensor, baseline: str, *,
                        baseline_ids: Optional[Tensor] = None, keep: Optional[Tensor] = None) -> Tensor:
    """The path's start: ``[B, T, E]`` at the output of ``embedding``.

    Args:
        embedding: the model's token embedding.
        input_ids: ``[B, T]`` the explained input.
        baseline: one of :data:`BASELINES`.
        baseline_ids: ``[B, T]`` the reference token ids (``"pad"`` embeds them; required there).
        keep: ``[B, T]`` positions that keep the input's embedding under ``"zero"`` and
            ``"mean"`` (``None``: none).

    Returns:
        ``[B, T, E]``, without a graph.
    """
    check_baseline(baseline)
    with torch.no_grad():
        if baseline == "pad":
            if baseline_ids is None:
                raise ValueError("baseline='pad' needs baseline_ids (the pad or neutral token at each "
                                 "position)")
            return embedding(baseline_ids)
        end = embedding(input_ids)  # [B, T, E]
        if baseline == "zero":
            start = torch.zeros_like(end)
        else:
            start = mean_embedding(embedding).expand_as(end).clone()
        if keep is not None:
            start = torch.where(keep.to(end.device)[..., None], end, start)
        return start
