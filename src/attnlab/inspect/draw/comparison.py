"""The comparison page: two models' per-head statistics and their differences (offline)."""

from __future__ import annotations

import html
from typing import Any, Mapping, Optional

from .report import STATISTIC_DESCRIPTIONS, _meta_html, _page, stats_tables_html

__all__ = ["comparison_fragment", "render_comparison"]


def _number(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.4g}"


def comparison_fragment(comparison: Mapping[str, Any]) -> str:
    """Summary table, then per statistic the A, B and B − A tables side by side (HTML)."""
    a, b = (html.escape(str(name)) for name in comparison["models"])
    rows = []
    for name, values in comparison["summary"].items():
        largest = values["largest_change"]
        where = (
            "–"
            if largest is None
            else (
                f"{html.escape(largest['layer'])}, {html.escape(largest['head'])}: {_number(largest['difference'])}"
            )
        )
        rows.append(
            f"<tr><th>{html.escape(name)}</th><td>{_number(values['mean_a'])}</td><td>{_number(values['mean_b'])}</td>"
            f"<td>{_number(values['mean_abs_difference'])}</td><td>{where}</td></tr>"
        )
    summary = (
        '<table class="stats comparison-summary"><thead><tr><th>statistic</th>'
        f"<th>mean, {a}</th><th>mean, {b}</th><th>mean |{b} − {a}|</th><th>largest change</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    note = (
        ""
        if comparison["same_shape"]
        else (
            '<p class="note">The models differ in layers or heads: differences only where both have the head.</p>'
        )
    )
    sections = []
    for name, values in comparison["statistics"].items():
        tables = []
        for label, key, layers in (
            (a, "a", comparison["layers"]["a"]),
            (b, "b", comparison["layers"]["b"]),
            (f"{b} − {a}", "difference", comparison["layers"]["a"]),
        ):
            tables.append(
                f'<div class="side" data-side="{key}"><h3>{label}</h3>'
                f"{stats_tables_html({name: values[key]}, layers, signed=key == 'difference')}</div>"
            )
        description = STATISTIC_DESCRIPTIONS.get(name, "")
        sections.append(
            f'<section data-statistic="{html.escape(name)}"><h2>{html.escape(name)}</h2>'
            f'<p class="note">{html.escape(description)}</p>'
            f'<div style="display:flex;flex-wrap:wrap;gap:14px">{"".join(tables)}</div></section>'
        )
    return f'<div class="attnlab-comparison"><section><h2>Summary</h2>{note}{summary}</section>{"".join(sections)}</div>'


def render_comparison(
    comparison: Mapping[str, Any],
    *,
    title: str = "attnlab model comparison",
    meta: Optional[Mapping[str, str]] = None,
) -> str:
    """A whole offline page for :func:`~attnlab.inspect.compute.comparison.compare_statistics`' result."""
    body = f"<header><h1>{html.escape(title)}</h1>{_meta_html(meta)}</header><main>{comparison_fragment(comparison)}</main>"
    return _page(title, body)
