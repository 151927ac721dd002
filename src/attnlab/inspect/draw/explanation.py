"""Pictures and pages of per-token attribution scores: methods side by side.

Dimension letters: ``M`` methods, ``T`` tokens.

Scores of different methods live on different scales (attention sums to 1, integrated
gradients are in logit units and signed), so each method is shown on its own scale
(:func:`normalized_scores`): blue for positive, red for negative. Pages inline everything
and write token text only with ``textContent`` (see :mod:`.report`); the fragment's style and
script are ``assets/explanation.css`` and ``.js`` (package data).
"""

from __future__ import annotations

import html
import secrets
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from ._assets import asset
from .report import _meta_html, _page, json_for_script

__all__ = ["normalized_scores", "plot_explanation", "render_explanation", "explanation_fragment"]


def normalized_scores(scores: Sequence[float]) -> list[float]:
    """Scores for display in [-1, 1]: each over its row's largest absolute value, so 0 stays 0.

    A flat row (rollout's, which adds the identity to every token, often is) stays flat;
    stretching each row from its smallest to its largest score made a row of 0.140..0.146
    look as contrasted as one of 0..0.9. The row's label gives its range.
    """
    values = np.nan_to_num(np.asarray(scores, dtype=np.float64))
    if not values.size:
        return []
    largest = float(np.abs(values).max())
    return (values / largest if largest > 0 else np.zeros_like(values)).round(6).tolist()


def plot_explanation(
    tokens: Sequence[str], scores: Mapping[str, Sequence[float]], *, title: str = "", max_tokens: int = 80
) -> Figure:
    """Methods (rows) x tokens (columns), each row on its own scale (:func:`normalized_scores`).

    Each row's label gives the range its colours stand for, and the colour bar says how
    rows are scaled; a text longer than ``max_tokens`` says in the title how much is drawn.

    Args:
        tokens: the ``T`` tokens.
        scores: ``{method: [T] scores}``.
        title: figure title.
        max_tokens: only the first this many tokens are drawn.
    """
    methods = list(scores)
    T = min(len(tokens), max_tokens)
    matrix = np.array([normalized_scores(scores[m])[:T] for m in methods])  # [M, T]
    figure = Figure(figsize=(max(4.0, 0.32 * T + 2.2), 0.45 * len(methods) + 1.3))
    axes = figure.add_subplot()
    image = axes.imshow(matrix, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
    axes.set_yticks(range(len(methods)), [f"{m}\n{_row_range(scores[m])}" for m in methods], fontsize=8)
    axes.set_xticks(range(T), [str(t) for t in tokens[:T]], rotation=90, fontsize=8)
    cut = f" (first {T} of {len(tokens)} tokens)" if len(tokens) > T else ""
    axes.set_title((title or "token scores per method") + cut, fontsize=10)
    bar = figure.colorbar(image, ax=axes, fraction=0.03, pad=0.01)
    bar.set_label("score on its row's scale:\nover the row's largest |score|", fontsize=7)
    return figure


def _row_range(scores: Sequence[float]) -> str:
    """What a row's colours span: ``0.012..0.31`` (never negative) or ``±0.42`` (signed)."""
    values = np.nan_to_num(np.asarray(scores, dtype=np.float64))
    if not values.size:
        return ""
    if values.min() >= 0:
        return f"{values.min():.3g}..{values.max():.3g}"
    return f"±{np.abs(values).max():.3g}"


def _data(tokens: Sequence[str], scores: Mapping[str, Sequence[float]],
          faithfulness: Optional[Mapping[str, Any]] = None) -> dict:
    return {
        "tokens": [str(token) for token in tokens],
        "methods": [
            {
                "name": name,
                "scores": [round(float(v), 6) for v in values],
                "normalized": normalized_scores(values),
                **method_faithfulness(faithfulness, name),
            }
            for name, values in scores.items()
        ],
    }


def method_faithfulness(faithfulness: Optional[Mapping[str, Any]], method: str) -> dict[str, Any]:
    """The page's line on ``method``'s measured faithfulness (:func:`~attnlab.inspect.faithfulness_notes.
    faithfulness_notes`' entry): ``{"faithfulness": note, "below_random": bool}``, or nothing."""
    entry = (faithfulness or {}).get("methods", {}).get(method)
    if entry is None:
        return {}
    return {"faithfulness": entry["note"], "below_random": bool(entry["at_or_below_random"])}


def explanation_fragment(
    tokens: Sequence[str], scores: Mapping[str, Sequence[float]], *, caption: str = "",
    faithfulness: Optional[Mapping[str, Any]] = None,
) -> str:
    """An HTML fragment (for notebooks and pages): every method's tokens as highlighted text.

    Element ids are random, so several fragments can share one notebook. ``faithfulness``
    (:func:`~attnlab.inspect.faithfulness_notes.faithfulness_notes`) puts each method's measured
    faithfulness under its name, a method at or below random marked as such.
    """
    for name, values in scores.items():
        if len(values) != len(tokens):
            raise ValueError(f"{name} has {len(values)} scores for {len(tokens)} tokens")
    suffix = secrets.token_hex(6)
    data_id, root_id = f"attnlab-explanation-data-{suffix}", f"attnlab-explanation-{suffix}"
    fragment = (asset("explanation.js").replace("ATTNLAB_DATA_ID", json_for_script(data_id))
                .replace("ATTNLAB_ROOT_ID", json_for_script(root_id)))
    script = asset("method_box.js") + fragment
    note = f'<p class="note">{html.escape(caption)}</p>' if caption else ""
    return (
        f'<div class="attnlab-explanation"><style>{asset("explanation.css")}</style>{note}'
        f'<div class="methods" id="{root_id}"></div>'
        f'<script id="{data_id}" type="application/json">'
        f"{json_for_script(_data(tokens, scores, faithfulness))}</script>"
        f"<script>{script}</script></div>"
    )


def render_explanation(
    tokens: Sequence[str],
    scores: Mapping[str, Sequence[float]],
    *,
    title: str = "attnlab explanation",
    meta: Optional[Mapping[str, str]] = None,
    faithfulness: Optional[Mapping[str, Any]] = None,
) -> str:
    """A whole offline page: the methods as highlighted text side by side, each with its measured
    faithfulness when ``faithfulness`` is given."""
    caption = (
        "Each method on its own scale: its scores over their largest |score| (blue positive, red "
        "negative), so a flat row stays flat; hover a token for its score."
    )
    body = (
        f"<header><h1>{html.escape(title)}</h1>{_meta_html(meta)}</header>"
        f"<main><section>{explanation_fragment(tokens, scores, caption=caption, faithfulness=faithfulness)}"
        "</section></main>"
    )
    return _page(title, body)
