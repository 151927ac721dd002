"""Texts in, statistics JSON, plots and an HTML summary out: what ``attnlab analyze`` does."""

from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from torch import nn

from ..data.padding import pad_id_for
from ..data.text_batches import encode_batches
from ..inspect.compute.analyzer import AttentionAnalyzer, AttentionStatistics
from ..inspect.compute.inspectable import inspectable, require
from ..inspect.compute.token_groups import special_token_groups
from ..inspect.draw.plots import plot_statistic, save_figure
from ..inspect.draw.report import inline_frame, render_summary, stats_tables_html

logger = logging.getLogger(__name__)

__all__ = ["Analysis", "analyze_rows", "check_importance_inputs", "write_analysis", "write_statistics"]


@dataclass
class Analysis:
    """What :func:`write_analysis` wrote.

    Attributes:
        statistics: the result.
        json: path of ``statistics.json``; summary: path of ``summary.html``;
        figures: the plots.
    """

    statistics: AttentionStatistics
    json: Path
    summary: Path
    figures: list[Path]

    def _repr_html_(self) -> str:
        """The summary page inline in Jupyter and VS Code (offline, in a frame)."""
        return inline_frame(self.summary.read_text(encoding="utf-8"), height=800)


def check_importance_inputs(model: nn.Module, rows: Sequence[tuple[str, Optional[int]]]) -> None:
    """Head importance needs heads to mask, and a loss: a language model's on the text
    itself, or a classifier's on a class for every text: say which is missing."""
    view = inspectable(model)
    require(view, "intervene", "--importance")
    if view.kind in ("decoder", "encoder-decoder"):
        return  # the loss of predicting the text itself (heads.language_model_loss): no label needed
    classes = len(view.label_names) if view.label_names else getattr(model, "num_labels", None)
    if not isinstance(classes, int):
        raise ValueError(f"--importance needs a classifier (class logits and a loss); this "
                         f"{type(model).__name__} has none: leave --importance out")
    missing = sum(label is None for _, label in rows)
    if missing:
        names = getattr(model, "label_names", None)
        accepted = f"the model's label names {list(names)} or class ids" if names else "class ids"
        raise ValueError(f"--importance needs a label for every text; {missing} of {len(rows)} have none that the "
                         f"model knows (a label column holding {accepted} 0..{classes - 1})")
    out_of_range = [label for _, label in rows if not 0 <= label < classes]
    if out_of_range:
        raise ValueError(f"--importance: label {out_of_range[0]} is not a class of the model (0..{classes - 1})")


def analyze_rows(
    model: nn.Module,
    tokenizer: Any,
    rows: Sequence[tuple[str, Optional[int]]],
    *,
    batch_size: int = 32,
    max_length: int = 128,
    max_attention_cells: Optional[int] = 32 * 64 * 64,
    sparsity_threshold: float = 0.1,
    top_k: int = 3,
    importance: bool = False,
    head_mask: Optional[Mapping[str, Iterable[int]]] = None,
    progress: bool = False,
) -> AttentionStatistics:
    """Statistics of ``rows`` (texts tokenized and batched lazily), head importance on request.

    Args:
        model: the model; tokenizer: its ``tokenizers.Tokenizer``.
        rows: ``[(text, label or None), ...]``.
        batch_size, max_length: batching of the texts.
        max_attention_cells: at most this many ``B * T * T`` cells a batch (long texts
            come in smaller batches), which keeps peak memory independent of the data;
            ``None`` for plain ``batch_size`` batches.
        sparsity_threshold, top_k: see :class:`~attnlab.inspect.AttentionAnalyzer`.
        importance: also compute head importance (needs labels and a model with logits).
        head_mask: heads to switch off, ``{"layer_k": [heads]}`` (0-based).
        progress: show a progress bar.
    """
    if importance:  # checked before the statistics pass, not after it
        check_importance_inputs(model, rows)
    pad_id = pad_id_for(tokenizer, model)

    def batches():
        return encode_batches(
            rows,
            tokenizer,
            batch_size=batch_size,
            max_length=max_length,
            pad_id=pad_id,
            max_attention_cells=max_attention_cells,
        )

    analyzer = AttentionAnalyzer(
        model,
        pad_id=pad_id,
        sparsity_threshold=sparsity_threshold,
        top_k=top_k,
        token_groups=special_token_groups(tokenizer),
    )
    statistics = analyzer.analyze_attention_distribution(
        batches(), head_mask=head_mask, progress=progress, total=len(rows)
    )
    if importance:
        statistics.head_importance = analyzer.head_importance(batches()).tolist()
    statistics.settings.update(
        {
            "batch_size": batch_size,
            "max_length": max_length,
            "max_attention_cells": max_attention_cells,
            "texts": len(rows),
        }
    )
    return statistics


def write_analysis(
    model: nn.Module,
    tokenizer: Any,
    rows: Sequence[tuple[str, Optional[int]]],
    out: Union[str, Path],
    *,
    formats: Sequence[str] = ("png",),
    model_name: str = "model",
    data_name: str = "data",
    **options: Any,
) -> Analysis:
    """Analyse ``rows`` and write ``statistics.json``, ``plots/<statistic>.<fmt>`` and ``summary.html``.

    Args:
        model, tokenizer, rows: as in :func:`analyze_rows`.
        out: output directory (created).
        formats: plot formats.
        model_name, data_name: shown in the summary.
        **options: passed to :func:`analyze_rows` (``batch_size``, ``importance``, ...).
    """
    statistics = analyze_rows(model, tokenizer, rows, **options)
    return write_statistics(statistics, out, formats=formats, model_name=model_name, data_name=data_name)


def write_statistics(
    statistics: AttentionStatistics,
    out: Union[str, Path],
    *,
    formats: Sequence[str] = ("png",),
    model_name: str = "model",
    data_name: str = "data",
    examples_name: str = "texts",
) -> Analysis:
    """Write ``statistics.json``, one plot per statistic and ``summary.html`` into ``out``
    (``examples_name``: what the examples are called on the page, ``texts`` or ``images``)."""
    out = Path(out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    statistics.settings.update({"data": data_name, "model": model_name})
    json_path = statistics.save_json(out / "statistics.json")

    figures: list[Path] = []
    images = {}
    matrices = {name: statistics.matrix(name) for name in statistics.keys()}
    if statistics.head_importance is not None:
        import numpy as np

        matrices["head_importance"] = np.asarray(statistics.head_importance)
    for name, matrix in matrices.items():
        written = save_figure(
            plot_statistic(matrix, name, layers=statistics.layers), out / "plots" / name, formats
        )
        figures += written
        png = next((path for path in written if path.suffix == ".png"), None)
        if png is not None:
            images[name] = png
    extra = {}
    if statistics.rollout:
        rows_html = "".join(
            f"<tr><th>{html.escape(layer)}</th>"
            f"<td>{values['entropy']:.3f}</td><td>{values['self']:.3f}</td></tr>"
            for layer, values in statistics.rollout.items()
        )
        extra["Attention rollout (Abnar & Zuidema, 2020)"] = (
            '<table class="stats"><thead><tr><th>after layer</th><th>row entropy</th>'
            "<th>share kept by the token itself</th>"
            f"</tr></thead><tbody>{rows_html}</tbody></table>"
        )
    if statistics.head_importance is not None:
        extra["Head importance (Michel et al., 2019)"] = stats_tables_html(
            {"head_importance": statistics.head_importance}, statistics.layers
        )
    summary = out / "summary.html"
    summary.write_text(
        render_summary(
            {name: statistics[name] for name in statistics.keys()},
            statistics.layers,
            meta={
                "model": model_name,
                "data": f"{data_name}: {statistics.examples} {examples_name}, {statistics.tokens} tokens",
                "settings": json.dumps({k: v for k, v in statistics.settings.items() if k != "token_groups"}),
            },
            images=images,
            extra_tables=extra,
        ),
        encoding="utf-8",
    )
    return Analysis(statistics, json_path, summary, figures)
