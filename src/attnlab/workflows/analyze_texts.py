"""Texts in, statistics JSON, plots and an HTML summary out: what ``attnlab analyze`` does."""

from __future__ import annotations

import contextlib
import html
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from torch import nn

from ..data.padding import pad_id_for
from ..data.text_batches import encode_batches
from ..inspect.compute.analyzer import AttentionAnalyzer, AttentionStatistics
from ..inspect.compute.heads import importance_from
from ..inspect.compute.inspectable import inspectable, require
from ..inspect.compute.token_groups import special_token_groups
from ..inspect.draw.plots import plot_statistic, save_figure
from ..inspect.draw.report import inline_frame, render_summary, stats_tables_html
from ..train.distributed import distributed_info
from .corpus_pass import CorpusPass, fingerprint

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


def analyze_rows(model: nn.Module, tokenizer: Any, rows: Sequence[tuple[str, Optional[int]]],
                 **options: Any) -> AttentionStatistics:
    """Statistics of ``rows`` (texts tokenized and batched lazily), head importance on request.

    Under ``torchrun`` (a process group set up), each process takes every N-th batch and the
    float64 sums of all processes are added before any mean is taken
    (:mod:`~attnlab.workflows.corpus_pass`): every process returns the result of the whole data.

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
        progress: show a progress bar (process 0 shows the whole corpus).
        checkpoint: a directory (the output directory) where partial sums are kept every
            ``checkpoint_seconds`` and on SIGINT / SIGTERM; a run of the same data, settings,
            model (``model_name``) and number of processes continues from them, and they go
            when the result is complete.
    """
    statistics, corpus = _analyze_rows(model, tokenizer, rows, **options)
    corpus.finish()
    return statistics


def _analyze_rows(
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
    checkpoint: Optional[Union[str, Path]] = None,
    checkpoint_seconds: float = 60.0,
    model_name: str = "model",
) -> tuple[AttentionStatistics, CorpusPass]:
    """:func:`analyze_rows`, and the checkpoints to remove once the result is kept."""
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
    settings = {"batch_size": batch_size, "max_length": max_length, "max_attention_cells": max_attention_cells}
    info = distributed_info()
    key = None if checkpoint is None else fingerprint(  # what a checkpoint must match to be resumed
        rows=list(rows), settings=settings, sparsity_threshold=sparsity_threshold, top_k=top_k,
        importance=importance, head_mask=head_mask, model=model_name, architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()), processes=info.world_size)
    corpus = CorpusPass(None if checkpoint is None else Path(checkpoint), key,
                        checkpoint_seconds=checkpoint_seconds, info=info)
    with _bar(progress and info.is_main, len(rows), "analyze") as bar:
        state = corpus.run(
            "statistics", batches(),
            lambda own, state, after: analyzer.statistics_pass(own, head_mask=head_mask, state=state,
                                                               after_batch=after),
            progress=bar)
    gradients = None
    if importance:
        with _bar(progress and info.is_main, len(rows), "importance") as bar:
            gradients = corpus.run("importance", batches(), analyzer.importance_pass,
                                   progress=bar)
    state, gradients = corpus.merged((state, gradients))
    statistics = analyzer.statistics_from(state, head_mask=head_mask)
    if gradients is not None:
        statistics.head_importance = importance_from(gradients["total"], gradients["batches"]).tolist()
    statistics.settings.update({**settings, "texts": len(rows)})
    return statistics, corpus


@contextlib.contextmanager
def _bar(show: bool, total: int, what: str) -> Iterator[Optional[Callable[[int], None]]]:
    """Process 0's progress over the whole corpus, shown from the first batch on (an input
    refused before any batch leaves no bar behind); each of its batches stands for one of
    every process."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm

    processes = distributed_info().world_size
    bar = None

    def advance(examples: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=what if processes == 1 else f"{what} ({processes} processes)", unit="text")
        bar.update(min(examples * processes, bar.total - bar.n))

    try:
        yield advance
    finally:
        if bar is not None:
            bar.close()


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
) -> Optional[Analysis]:
    """Analyse ``rows`` and write ``statistics.json``, ``plots/<statistic>.<fmt>`` and ``summary.html``
    (partial sums in ``out/.analysis-partial`` while it runs: the same call resumes from them).
    Under ``torchrun`` only process 0 writes; the others return ``None``.

    Args:
        model, tokenizer, rows: as in :func:`analyze_rows`.
        out: output directory (created).
        formats: plot formats.
        model_name, data_name: shown in the summary.
        **options: passed to :func:`analyze_rows` (``batch_size``, ``importance``, ...).
    """
    statistics, corpus = _analyze_rows(model, tokenizer, rows, checkpoint=out, model_name=model_name, **options)
    analysis = None
    if corpus.info.is_main:  # under torchrun every process has the result; process 0 writes it
        analysis = write_statistics(statistics, out, formats=formats, model_name=model_name, data_name=data_name)
    corpus.finish()  # the checkpoints go once the result is written
    return analysis


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
