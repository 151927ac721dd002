"""``generation.html``: step through a generation and see what each new token attended to.

Dimension letters: ``G`` generated tokens, ``L`` layers, ``H`` heads, ``N`` final length.

Pick a generated token (slider, previous / next); the text up to it is shaded by the
weight it gave each earlier token in the chosen layer and head (or the mean of heads),
and a layers x heads table names, for every layer and head, the token it attended to
most (the first token left out: it is often a sink). Offline and escaped like the
attention report (:mod:`.report`): token text travels as JSON and is written with
``textContent``.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import numpy as np
from torch import Tensor

from ._assets import asset
from .report import _meta_html, _pack, _page

__all__ = ["render_generation_report", "write_generation_report"]


def render_generation_report(
    rows: Union[Tensor, np.ndarray],
    tokens: Sequence[str],
    prompt_length: int,
    *,
    layers: Optional[Sequence[str]] = None,
    title: str = "attnlab generation",
    meta: Optional[Mapping[str, str]] = None,
) -> str:
    """The generation page as an HTML string.

    Args:
        rows: ``[G, L, H, N]``: row ``g`` holds generated token ``g``'s weights over every
            position (zeros after itself); ``G = N - prompt_length``.
        tokens: the ``N`` token strings, prompt first.
        prompt_length: where generated tokens start.
        layers: layer names (default ``layer_1, ...``).
        title: page title.
        meta: ``{label: text}`` lines under the title.
    """
    values = rows.detach().float().cpu().numpy() if isinstance(rows, Tensor) else np.asarray(rows, np.float32)
    N = len(tokens)
    if values.ndim != 4 or values.shape[0] != N - prompt_length or values.shape[3] != N:
        raise ValueError(f"rows must be [G, L, H, N] with N = {N} tokens and G = N - prompt_length = "
                         f"{N - prompt_length}, got shape {values.shape}")
    if values.shape[0] == 0:
        raise ValueError("nothing was generated: the page needs at least one generated token")
    names = list(layers) if layers is not None else [f"layer_{index + 1}" for index in range(values.shape[1])]
    data = {"tokens": [str(token) for token in tokens], "prompt_length": int(prompt_length), "layers": names,
            "heads": int(values.shape[2]), "weights": _pack(values)}
    body = f"""
<header><h1>{html.escape(title)}</h1>{_meta_html(meta)}</header>
<main>
<section>
  <div class="controls"><button type="button" id="previous">◀ previous</button>
    <input type="range" id="step" min="0" value="0"> <button type="button" id="next">next ▶</button>
    <span id="step-label"></span></div>
  <h2 id="view-title"></h2>
  <div class="controls"><span class="label">layer</span><div id="layer-buttons" class="controls"></div></div>
  <div class="controls"><span class="label">head</span><div id="head-buttons" class="controls"></div></div>
  <div class="strip-title">the text so far, shaded by what the chosen token attends to (underlined: generated)</div>
  <div id="text"></div>
</section>
<section>
  <h2>Every layer and head: the token it attends to most (the first token left out)</h2>
  <table id="layers-heads" class="layers-heads"></table>
</section>
</main>"""
    page = _page(title, body, script=asset("generation.js"), data=data)
    return page.replace("</style>", asset("generation.css") + "</style>", 1)


def write_generation_report(path: Union[str, Path], rows, tokens: Sequence[str], prompt_length: int,
                            **options) -> Path:
    """Write :func:`render_generation_report` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_generation_report(rows, tokens, prompt_length, **options), encoding="utf-8")
    return path
