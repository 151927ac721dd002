"""Self-contained HTML pages: the interactive attention report and the analysis summary.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` query length, ``S`` key length.

Everything a page needs (style, script, data, images) is inlined: it opens with no
network. Token text reaches the page only as JSON inside a ``<script type=
"application/json">`` block with ``<``, ``>`` and ``&`` escaped, and the script writes
it with ``textContent``; tables are built here with :func:`html.escape`. A token such
as ``<script>`` therefore shows as text.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
from torch import Tensor

from ._assets import asset
from .plots import bucket_attention

__all__ = [
    "render_report", "write_report", "render_summary", "stats_tables_html", "json_for_script", "inline_frame"
]


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def inline_frame(page: str, *, height: int = 640) -> str:
    """A whole page as an ``<iframe srcdoc>`` for a notebook cell: its ids and script stay
    apart from the notebook's and from other frames, and nothing is fetched."""
    return (
        f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: {int(height)}px; '
        'border: 1px solid #d0d4da"></iframe>'
    )


def _pack(values: np.ndarray) -> str:
    """Base64 of little-endian uint16 ``round(value * 65535)``, values clipped to [0, 1]."""
    quantised = np.round(np.clip(values, 0.0, 1.0) * 65535).astype("<u2")
    return base64.b64encode(quantised.tobytes()).decode("ascii")


def _page(title: str, body: str, *, script: str = "", data: Optional[dict] = None) -> str:
    data_block = (
        f'<script id="attnlab-data" type="application/json">{json_for_script(data)}</script>\n'
        if data is not None
        else ""
    )
    script_block = f"<script>{script}</script>\n" if script else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        # an empty icon, so the browser does not ask for /favicon.ico
        '<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>{asset('report.css')}</style>\n</head>\n<body>\n"
        f"{body}\n{data_block}{script_block}</body>\n</html>\n"
    )


def _meta_html(meta: Optional[Mapping[str, str]], limit: int = 300) -> str:
    """Escaped ``label: text`` lines; long texts are cut, with the whole text one click away."""
    lines = []
    for key, value in (meta or {}).items():
        text = str(value)
        shown = html.escape(text if len(text) <= limit else text[:limit] + "…")
        if len(text) > limit:
            shown += f"<details><summary>whole text</summary>{html.escape(text)}</details>"
        lines.append(f'<p class="meta"><b>{html.escape(str(key))}:</b> {shown}</p>')
    return "".join(lines)


def _bucket_labels(labels: Sequence[str], tokens: Sequence[str], width: int = 18) -> list[str]:
    """``"12-17 the film is…"``: a bucket's position range and the start of its text."""
    named = []
    for label in labels:
        start, stop = (int(part) for part in label.split("-"))
        text = " ".join(tokens[start : stop + 1])
        named.append(f"{label} {text[:width]}{'…' if len(text) > width else ''}")
    return named


def _format(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:.3f}"


def stats_tables_html(
    tables: Mapping[str, Sequence[Sequence[Optional[float]]]],
    layers: Sequence[str],
    *,
    descriptions: Optional[Mapping[str, str]] = None,
    signed: bool = False,
) -> str:
    """One ``layers x heads`` HTML table per statistic, cells shaded by value.

    The shade starts at 0 for values that cannot be negative (so heads that differ by a
    hair look alike); ``signed`` tables (differences) are shaded by size, blue above 0 and
    red below, so the largest change is the darkest whatever its sign.

    Args:
        tables: ``{statistic: [L][H] values}`` (``None`` or NaN where missing).
        layers: row names.
        descriptions: optional one-line explanation per statistic.
        signed: shade by ``|value|``, the sign by hue.
    """
    parts = []
    for name, matrix in tables.items():
        values = [v for row in matrix for v in row if v is not None and math.isfinite(v)]
        low, high = (min(values), max(values)) if values else (0.0, 1.0)
        if signed:
            low, high = 0.0, max((abs(v) for v in values), default=0.0)
        elif low >= 0:
            low, high = 0.0, (1.0 if high <= 1 else high)
        heads = max((len(row) for row in matrix), default=0)
        header = "".join(f"<th>{h + 1}</th>" for h in range(heads))
        body = []
        for layer, row in zip(layers, matrix):
            cells = []
            for value in row:
                finite = value is not None and math.isfinite(value)
                size = abs(value) if finite and signed else value
                shade = 0.0 if not finite or high == low else (size - low) / (high - low)
                colour = "178,24,43" if signed and finite and value < 0 else "33,102,172"
                cells.append(
                    f'<td style="background: rgba({colour},{0.08 + 0.5 * shade:.3f})">{_format(value)}</td>'
                )
            body.append(f"<tr><th>{html.escape(layer)}</th>{''.join(cells)}</tr>")
        caption = html.escape(name)
        if descriptions and name in descriptions:
            caption += f' <span class="note">— {html.escape(descriptions[name])}</span>'
        parts.append(
            f'<table class="stats" data-statistic="{html.escape(name)}"><caption>{caption}</caption>'
            f"<thead><tr><th>layer \\ head</th>{header}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )
    return '<div class="tables">' + "\n".join(parts) + "</div>"


STATISTIC_DESCRIPTIONS = {
    "entropy": "mean row entropy (nats) over real keys",
    "normalized_entropy": "entropy / log(number of real keys the query may attend); 1 = uniform",
    "sink_mass": "mass on the first real token (the attention sink)",
    "sparsity": "share of real keys below the sparsity threshold",
    "top_k_mass": "mass on the k largest weights",
    "gini": "Gini coefficient of the row; 0 = uniform",
    "alignment_score": "mass on the reference alignment (default: previous/next token)",
    "alignment_argmax": "how often the most attended key is a reference key",
    "mean_offset": "mean attended offset s - t (negative = looks back)",
    "mean_distance": "mean attended distance |s - t|",
    "beyond_window": "mass on keys the sliding window leaves out (t - s >= W), rows t >= W; exactly 0 on local layers",
    "mean_attention_distance": "patches: mean attended distance in pixels on the image (ViT's figure 7)",
    "class_prefix_mass": "class token's mass on the tokens before the patches (itself, distillation, registers)",
    "class_patch_entropy": "entropy (nats) of the class token's attention over the patches",
}


def _numpy(value: Union[Tensor, np.ndarray]) -> np.ndarray:
    if isinstance(value, Tensor):
        return value.detach().float().cpu().numpy()
    return np.asarray(value, dtype=np.float32)


def render_report(
    attentions: Mapping[str, Union[Tensor, np.ndarray]],
    tokens: Sequence[str],
    *,
    title: str = "attnlab attention report",
    meta: Optional[Mapping[str, str]] = None,
    statistics: Optional[Mapping[str, Sequence[Sequence[Optional[float]]]]] = None,
    rollout: Optional[Union[Tensor, np.ndarray]] = None,
    max_tokens: int = 128,
    key_tokens: Optional[Sequence[str]] = None,
    sides: tuple[str, str] = ("queries", "keys"),
) -> str:
    """The interactive report for one input, as an HTML string.

    Pick a layer and a head (or the mean of heads, or the rollout), hover a token to see
    what it attends to and what attends to it, click a tile of the model grid, read the
    statistics tables.

    Maps whose queries and keys come from different sequences (cross-attention, ``[H, T, S]``)
    take ``key_tokens``; the page then names its two sides (``sides``, for example
    ``("target", "source")``) on the strips and the map's axes.

    Args:
        attentions: ``{"layer_1": [H, T, S], ...}`` for one example (``S = T`` for
            self-attention).
        tokens: the ``T`` query token strings (and the keys' when ``key_tokens`` is not given).
        title: page title.
        meta: ``{label: text}`` lines shown under the title (model, input, ...).
        statistics: ``{statistic: [L][H]}`` tables.
        rollout: ``[L, T, T]`` attention rollout, adds a "rollout" view.
        max_tokens: longer inputs are pooled into this many position buckets (see
            :func:`attnlab.inspect.draw.plots.bucket_attention`).
        key_tokens: the ``S`` key token strings of a map whose keys are another sequence.
        sides: what the queries and the keys are, shown on the page.
    """
    names = list(attentions.keys())
    if not names:
        raise ValueError("attentions is empty")
    if len(sides) != 2 or not all(isinstance(side, str) and side for side in sides):
        raise ValueError(f"sides must be two names (queries, keys), got {sides!r}")
    square = key_tokens is None
    query_texts = list(map(str, tokens))
    key_texts = query_texts if square else list(map(str, key_tokens))
    maps = [_numpy(attentions[name]) for name in names]
    for name, stack in zip(names, maps):
        if stack.ndim != 3 or stack.shape[1:] != (len(query_texts), len(key_texts)):
            expected = (f"self-attention [H, T, T] with T = {len(query_texts)} tokens" if square else
                        f"[H, T, S] with T = {len(query_texts)} {sides[0]} and S = {len(key_texts)} {sides[1]} tokens")
            raise ValueError(f"{name} must be one example's {expected}, got shape {stack.shape}")
    heads = [stack.shape[0] for stack in maps]
    H = max(heads)
    shown_tokens, shown_keys = query_texts, key_texts
    buckets = False

    def reduce(matrix: np.ndarray) -> np.ndarray:
        nonlocal shown_tokens, shown_keys, buckets
        reduced, labels, key_labels = bucket_attention(matrix, query_texts, key_texts, max_tokens=max_tokens)
        if len(labels) != len(query_texts):
            shown_tokens, buckets = _bucket_labels(labels, query_texts), True
        if len(key_labels) != len(key_texts):
            shown_keys, buckets = _bucket_labels(key_labels, key_texts), True
        return reduced

    T, S = min(len(query_texts), max_tokens), min(len(key_texts), max_tokens)
    packed = np.zeros((len(maps), H, T, S), dtype=np.float32)
    for l, stack in enumerate(maps):
        for h in range(stack.shape[0]):
            packed[l, h] = reduce(stack[h])
    rollout_packed = None
    if rollout is not None:
        rollout_array = _numpy(rollout)
        if not square:
            raise ValueError("rollout needs self-attention maps; leave it out when key_tokens are given")
        if rollout_array.shape != (len(maps), len(tokens), len(tokens)):
            raise ValueError(
                f"rollout must be [L, T, T] = {(len(maps), len(tokens), len(tokens))}, "
                f"got {rollout_array.shape}"
            )
        rollout_packed = np.stack([reduce(matrix) for matrix in rollout_array])
    data = {
        "tokens": shown_tokens,
        "key_tokens": None if square else shown_keys,
        "sides": list(sides),
        "layers": names,
        "heads": heads,
        "max_heads": H,
        "weights": _pack(packed),
        "rollout": _pack(rollout_packed) if rollout_packed is not None else None,
    }
    meta_lines = _meta_html(meta)
    pooled = f"{len(tokens)} tokens pooled into {len(shown_tokens)} buckets " if square else (
        f"{len(query_texts)} {sides[0]} and {len(key_texts)} {sides[1]} tokens pooled into "
        f"{len(shown_tokens)} and {len(shown_keys)} buckets ")
    bucket_note = (
        f'<p class="note">{pooled}'
        "of neighbouring positions "
        "(rows averaged, columns summed); labels give position ranges.</p>"
        if buckets
        else ""
    )
    tables = (
        '<section id="statistics"><h2>Statistics of this input</h2>'
        + stats_tables_html(statistics, names, descriptions=STATISTIC_DESCRIPTIONS)
        + "</section>"
        if statistics
        else ""
    )
    q, k = (html.escape(side) for side in sides)
    strip_titles = (
        ("tokens — hover one", "what it attends to", "what attends to it") if square else
        (f"{q} tokens — hover one", f"what it attends to among the {k} tokens",
         f"{k} tokens — hover one: which {q} tokens attend to it")
    )
    body = f"""
<header><h1>{html.escape(title)}</h1>{meta_lines}</header>
<main>
<section id="view-section">
  <h2 id="view-title"></h2>
  <div class="controls"><span class="label">layer</span><div id="layer-buttons" class="controls"></div></div>
  <div class="controls"><span class="label">head</span><div id="head-buttons" class="controls"></div></div>
  {bucket_note}
  <div class="strip-title">{strip_titles[0]}</div>
  <div id="tokens" class="strip"></div>
  <div id="hover-info"></div>
  <div class="strip-title">{strip_titles[1]}</div>
  <div id="attends-to" class="strip"></div>
  <div class="strip-title">{strip_titles[2]}</div>
  <div id="attended-by" class="strip"></div>
  <div class="strip-title">attention map — rows: {html.escape(sides[0])}, columns: {html.escape(sides[1])}</div>
  <div class="heat-wrap"><table id="heatmap" class="heat"></table></div>
</section>
<section id="model-section">
  <h2>Model view — every layer and head (click one; each tile scaled to its maximum)</h2>
  <div id="grid"></div>
</section>
{tables}
</main>"""
    return _page(title, body, script=asset("report.js"), data=data)


def write_report(
    path: Union[str, Path], attentions: Mapping[str, Any], tokens: Sequence[str], **options: Any
) -> Path:
    """Write :func:`render_report` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(attentions, tokens, **options), encoding="utf-8")
    return path


def render_summary(
    tables: Mapping[str, Sequence[Sequence[Optional[float]]]],
    layers: Sequence[str],
    *,
    title: str = "attnlab attention analysis",
    meta: Optional[Mapping[str, str]] = None,
    images: Optional[Mapping[str, Union[str, Path]]] = None,
    extra_tables: Optional[Mapping[str, str]] = None,
    descriptions: Optional[Mapping[str, str]] = None,
) -> str:
    """A static summary page: statistics tables and PNG plots inlined as data URIs.

    Args:
        tables: ``{statistic: [L][H]}``.
        layers: row names.
        title: page title.
        meta: ``{label: text}`` lines under the title.
        images: ``{caption: path to a PNG}``.
        extra_tables: ``{heading: ready HTML}`` (built with escaping by the caller).
        descriptions: ``{statistic: what it measures}`` in place of the usual
            descriptions (a table scored against another reference says which).
    """
    meta_lines = _meta_html(meta)
    figures = []
    for caption, image in (images or {}).items():
        encoded = base64.b64encode(Path(image).read_bytes()).decode("ascii")
        figures.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    extra = "".join(
        f"<section><h2>{html.escape(heading)}</h2>{content}</section>"
        for heading, content in (extra_tables or {}).items()
    )
    statistics_section = (
        '<section id="statistics"><h2>Statistics per layer and head</h2>'
        f"{stats_tables_html(tables, layers, descriptions={**STATISTIC_DESCRIPTIONS, **(descriptions or {})})}"
        "</section>"
    ) if tables else ""  # a page of pictures only (an image explanation) has no statistics
    body = f"""
<header><h1>{html.escape(title)}</h1>{meta_lines}</header>
<main>
{statistics_section}
{extra}
<section class="figures"><h2>Plots</h2>{''.join(figures)}</section>
</main>"""
    return _page(title, body)
