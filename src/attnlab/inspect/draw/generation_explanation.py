"""Pictures and pages of generated-token attributions: prompt x generated tokens, per method.

Dimension letters: ``M`` methods, ``G`` generated tokens, ``N`` all tokens (prompt +
generated), ``L`` layers.

The picture puts generated tokens in rows and the tokens before them in columns, one panel
per method, each row on its own scale (over its largest ``|score|``, so a flat row stays
flat: :func:`~.explanation.normalized_scores`); the positions a token
could not see are left blank. The page (offline: its style and script are the package's
``assets/generation_explanation.css`` / ``.js``, inlined; token text travels as JSON and is written
with ``textContent``) steps through the generated tokens and shows each method's scores
and the logit lens at the position that predicted the token.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from matplotlib.figure import Figure

from ._assets import asset
from .explanation import method_faithfulness, normalized_scores
from .logit_lens import visible_token
from .report import _meta_html, _page, inline_frame

__all__ = ["plot_generation_attribution", "render_generation_explanation", "generation_explanation_fragment"]


def plot_generation_attribution(
    tokens: Sequence[str], prompt_length: int, scores: Mapping[str, Sequence[Sequence[float]]], *,
    title: str = "", max_tokens: int = 60,
) -> Figure:
    """One panel per method: generated tokens (rows) x earlier tokens (columns).

    Args:
        tokens: the ``N`` tokens, prompt first.
        prompt_length: ``P``.
        scores: ``{method: [G][N]}``; row ``g`` scores positions ``0 .. P + g - 1``.
        title: figure title.
        max_tokens: columns drawn at most (the last ones, nearest the generated tokens).
    """
    N, P = len(tokens), prompt_length
    G = N - P
    columns = N - 1
    first = max(0, columns - max_tokens)
    width = columns - first
    methods = list(scores)
    figure = Figure(figsize=(max(5.0, 0.3 * width + 2.5), len(methods) * (0.3 * G + 1.2) + 0.6))
    for index, method in enumerate(methods):
        matrix = np.full((G, width), np.nan)
        for g in range(G):
            seen = P + g
            row = normalized_scores(list(scores[method][g])[:seen])
            matrix[g, : max(0, seen - first)] = row[first:seen]
        axes = figure.add_subplot(len(methods), 1, index + 1)
        image = axes.imshow(matrix, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest")
        axes.set_yticks(range(G), [visible_token(token) for token in tokens[P:]], fontsize=8)
        axes.set_xticks(range(width), [visible_token(token) for token in tokens[first: N - 1]], rotation=90,
                        fontsize=7)
        if first < P:
            axes.axvline(P - first - 0.5, color="black", linewidth=0.8)  # prompt | generated
        axes.set_ylabel("generated", fontsize=8)
        axes.set_title(method, fontsize=9, loc="left")
        figure.colorbar(image, ax=axes, fraction=0.02, pad=0.01)
    cut = f" (last {width} of {columns} earlier tokens)" if first else ""
    figure.suptitle((title or "which earlier tokens made each generated token") + cut, fontsize=10)
    figure.subplots_adjust(hspace=0.9)
    return figure


def render_generation_explanation(
    tokens: Sequence[str], prompt_length: int, scores: Mapping[str, Sequence[Sequence[float]]], *,
    objective: Sequence[float], objective_name: str = "log p(token)", lens: Optional[Mapping[str, Any]] = None,
    title: str = "attnlab explanation of generated text", meta: Optional[Mapping[str, str]] = None,
    faithfulness: Optional[Mapping[str, Any]] = None,
) -> str:
    """The whole offline page.

    Args:
        tokens: the ``N`` tokens, prompt first.
        prompt_length: ``P``.
        scores: ``{method: [G][N]}``.
        objective: ``[G]`` the explained quantity of each generated token.
        objective_name: what it is, for people.
        lens: the logit lens at each predicting position: ``{"layers": [L + 1 names], "top":
            [L + 1][G][K] {"token", "probability"}, "rank": [L + 1][G], "probability": [L + 1][G]}``.
        title: page title.
        meta: ``{label: text}`` lines under the title.
        faithfulness: each method's measured faithfulness
            (:func:`~attnlab.inspect.faithfulness_notes.faithfulness_notes`), shown under its name.
    """
    G = len(tokens) - prompt_length
    if G < 1 or prompt_length < 1:
        raise ValueError(f"the page needs a prompt and at least one generated token, got {len(tokens)} tokens "
                         f"with prompt_length={prompt_length}")
    for name, rows in scores.items():
        if len(rows) != G or any(len(row) != len(tokens) for row in rows):
            raise ValueError(f"{name} must hold {G} rows of {len(tokens)} scores")
    data = {
        "tokens": [str(token) for token in tokens],
        "prompt_length": int(prompt_length),
        "methods": [{"name": name, "scores": [[round(float(v), 6) for v in row] for row in rows],
                     **method_faithfulness(faithfulness, name)} for name, rows in scores.items()],
        "objective": [round(float(v), 6) for v in objective],
        "objective_name": objective_name,
        "lens": lens,
    }
    caption = ("Each method on its own scale: its scores over their largest |score| (blue positive, red "
               "negative), so a flat row stays flat; hover a token for its score. "
               "Underlined: generated before; outlined: the explained token.")
    body = f"""
<header><h1>{html.escape(title)}</h1>{_meta_html(meta)}</header>
<main>
<section>
  <div class="controls"><button type="button" id="previous">◀ previous</button>
    <input type="range" id="step" min="0" value="0"> <button type="button" id="next">next ▶</button>
    <span id="step-label"></span></div>
  <p class="note">{html.escape(caption)}</p>
  <div class="methods" id="methods"></div>
</section>
<section>
  <h2>Logit lens at the position that predicted it</h2>
  <p class="note">the residual stream after each layer, through the final norm and the LM head</p>
  <table id="lens" class="lens"></table>
</section>
</main>"""
    page = _page(title, body, script=asset("method_box.js") + asset("generation_explanation.js"), data=data)
    return page.replace("</style>", asset("generation_explanation.css") + "</style>", 1)


def generation_explanation_fragment(page: str, *, height: int = 720) -> str:
    """The page inside an ``<iframe srcdoc>`` for a notebook cell."""
    return inline_frame(page, height=height)
