"""Two models' per-head statistics side by side, with their differences.

Dimension letters: ``L`` layers, ``H`` heads.

:func:`compare_statistics` takes two :class:`~attnlab.inspect.AttentionStatistics`
computed on the same texts (say, before and after fine-tuning) and lines them up
statistic by statistic: ``a``, ``b`` and ``difference = b - a`` per (layer, head).
Differences exist only where both models have that layer and head.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .analyzer import AttentionStatistics

__all__ = ["compare_statistics"]


def _difference(
    a: list[list[Optional[float]]], b: list[list[Optional[float]]]
) -> list[list[Optional[float]]]:
    rows = []
    for row_a, row_b in zip(a, b):
        rows.append(
            [
                None if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)) else y - x
                for x, y in zip(row_a, row_b)
            ]
        )
    return rows


def compare_statistics(
    a: AttentionStatistics, b: AttentionStatistics, *, names: tuple[str, str] = ("A", "B")
) -> dict[str, Any]:
    """Per-head statistics of two models and their differences, as plain JSON values.

    Args:
        a: the first model's statistics.
        b: the second model's, on the same texts.
        names: how the two models are called.

    Returns:
        ``{"models": names, "layers": {"a": [...], "b": [...]}, "same_shape": bool,
        "statistics": {statistic: {"a": [L][H], "b": [L][H], "difference": [L][H] (b - a)}},
        "summary": {statistic: {"mean_a", "mean_b", "mean_abs_difference", "largest_change"}}}``;
        ``largest_change`` names the head (``layer_2``, ``head_3``: from 1) and its change.
    """
    if not isinstance(a, AttentionStatistics) or not isinstance(b, AttentionStatistics):
        raise TypeError(
            "compare_statistics takes two AttentionStatistics (from AttentionAnalyzer or analyze_rows)"
        )
    shared = [name for name in a.keys() if name in b.keys()]
    if a.head_importance is not None and b.head_importance is not None:
        shared.append("head_importance")
    statistics: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for name in shared:
        matrix_a = a.head_importance if name == "head_importance" else a[name]
        matrix_b = b.head_importance if name == "head_importance" else b[name]
        difference = _difference(matrix_a, matrix_b)
        statistics[name] = {"a": matrix_a, "b": matrix_b, "difference": difference}
        finite = lambda m: [v for row in m for v in row if v is not None and math.isfinite(v)]  # noqa: E731
        changes = [
            (abs(value), layer, head, value)
            for layer, row in enumerate(difference)
            for head, value in enumerate(row)
            if value is not None
        ]
        largest = max(changes, default=None)
        summary[name] = {
            "mean_a": sum(finite(matrix_a)) / max(len(finite(matrix_a)), 1),
            "mean_b": sum(finite(matrix_b)) / max(len(finite(matrix_b)), 1),
            "mean_abs_difference": (sum(c[0] for c in changes) / len(changes)) if changes else None,
            "largest_change": None
            if largest is None
            else {
                "layer": f"layer_{largest[1] + 1}",
                "head": f"head_{largest[2] + 1}",
                "difference": largest[3],
            },
        }
    return {
        "models": list(names),
        "layers": {"a": a.layers, "b": b.layers},
        "heads": {"a": a.num_heads, "b": b.num_heads},
        "same_shape": a.layers == b.layers and a.num_heads == b.num_heads,
        "texts": {"a": a.examples, "b": b.examples},
        "statistics": statistics,
        "summary": summary,
    }
