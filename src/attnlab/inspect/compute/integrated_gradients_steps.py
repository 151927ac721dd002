"""How many quadrature points integrated gradients needs: its completeness gap, and steps
chosen until the gap is small.

Integrated gradients' scores sum to ``f(x) - f(x')``, the objective's change from the
baseline to the input, up to the quadrature error ``delta``. The *completeness gap* is that
error against the change, ``|delta| / |f(x) - f(x')|`` (the largest over the explained
rows). A gap of 21 against a change of 4 (contrastive integrated gradients on SmolLM2 at
50 points) means the scores describe the quadrature, not the model: 300 points moved the
top score from 12.3 to 1.15. :func:`until_complete` doubles the points from
:data:`AUTO_STEPS`' first until the gap is under :data:`COMPLETENESS_TOLERANCE`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import Tensor

__all__ = ["AUTO_STEPS", "COMPLETENESS_TOLERANCE", "IG", "completeness_gap", "completeness_note", "row_gaps",
           "until_complete"]

IG = "integrated-gradients"
"""The method's name among the explain methods."""

COMPLETENESS_TOLERANCE = 0.05
"""The largest completeness gap accepted without a warning (5 % of the objective's change)."""

AUTO_STEPS = (50, 100, 200, 400)
"""The quadrature points tried in turn when none are given."""


def completeness_gap(scores: Tensor, delta: Tensor) -> float:
    """``max |delta| / |f(x) - f(x')|`` over rows: ``scores`` ``[R, T]`` (per row's tokens),
    ``delta`` ``[R]`` (``sum(scores) - (f(x) - f(x'))``)."""
    totals = scores.detach().double().reshape(delta.shape[0], -1).sum(-1)  # [R]
    error = delta.detach().double().reshape(-1)
    change = (totals - error).abs().clamp_min(1e-12)  # f(x) - f(x')
    return float((error.abs() / change).max())


def row_gaps(scores: Tensor, delta: Tensor) -> list[float]:
    """``|delta| / |f(x) - f(x')|`` of each row (``scores`` ``[R, T]``, ``delta`` ``[R]``):
    :func:`completeness_gap` is their largest."""
    return [completeness_gap(scores[r:r + 1], delta[r:r + 1]) for r in range(delta.shape[0])]


def completeness_note(steps: int, gap: float, baseline: str) -> str:
    """One line for people: points, gap and baseline, with a warning when the gap is over
    :data:`COMPLETENESS_TOLERANCE` (the scores then describe the quadrature as much as the model)."""
    line = f"{steps} points, {baseline} baseline, completeness gap {gap:.1%} of the objective's change"
    if gap > COMPLETENESS_TOLERANCE:
        line = (f"warning: {line}, over {COMPLETENESS_TOLERANCE:.0%}: the scores are approximate "
                f"(more steps, up to 1000, narrow the gap)")
    return line


def until_complete(run: Callable[[int], tuple[Any, Tensor, Tensor]], steps: Optional[int]
                   ) -> tuple[Any, int, float]:
    """Run integrated gradients with ``steps`` points, or (``None``) with :data:`AUTO_STEPS`
    in turn until the completeness gap is at most :data:`COMPLETENESS_TOLERANCE`.

    Args:
        run: ``run(steps) -> (result, scores [R, T], delta [R])``.
        steps: quadrature points, or ``None`` to choose them.

    Returns:
        ``(result, steps, gap)`` of the last run.
    """
    for points in (steps,) if steps is not None else AUTO_STEPS:
        result, scores, delta = run(points)
        gap = completeness_gap(scores, delta)
        if gap <= COMPLETENESS_TOLERANCE:
            break
    return result, points, gap
