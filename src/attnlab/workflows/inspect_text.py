"""One text in, every picture and the interactive report out: what ``attnlab inspect`` does.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from ..data.tokenization import token_texts
from ..inspect.compute.inspectable import inspectable, require
from ..inspect.compute.capture import capture_attention
from ..inspect.compute.causal_statistics import CAUSAL_STATISTICS, causal_statistics
from ..inspect.compute.heads import forward_batch
from ..inspect.compute.query_rows import RowChoice, check_rows
from ..inspect.compute.rollout import attention_rollout
from ..inspect.compute.statistics import HeadStatistics
from ..inspect.compute.token_groups import special_token_groups
from ..inspect.draw.plots import plot_head, plot_layer, plot_model, save_figure
from ..inspect.draw.report import inline_frame, write_report

__all__ = ["Inspection", "encode_text", "write_inspection"]


@dataclass
class Inspection:
    """What :func:`write_inspection` wrote.

    Attributes:
        report: path of ``report.html``.
        figures: every picture written.
        tokens: the tokens shown.
        attentions: ``{"layer_1": [H, T, T], ...}`` of the text.
    """

    report: Path
    figures: list[Path] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    attentions: dict[str, torch.Tensor] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        """The interactive report inline in Jupyter and VS Code (offline, in a frame)."""
        return inline_frame(self.report.read_text(encoding="utf-8"), height=900)


def encode_text(tokenizer: Any, text: str, max_length: int) -> tuple[torch.Tensor, list[str]]:
    """``(input_ids [1, T], tokens)`` for one text, cut to ``max_length`` tokens.

    The tokens are what each one reads as (``"cat"``, not byte-level BPE's ``"Ġcat"``; see
    :func:`attnlab.data.tokenization.token_texts`).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    encoding = tokenizer.encode(text)
    real = [index for index, keep in enumerate(encoding.attention_mask) if keep][:max_length]  # no padding
    ids, tokens = [encoding.ids[i] for i in real], [encoding.tokens[i] for i in real]
    if not ids:
        raise ValueError(f"the tokenizer produced no token for {text!r}")
    return torch.tensor([ids], dtype=torch.long), token_texts(tokenizer, ids, tokens)


def write_inspection(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    out: Union[str, Path],
    *,
    layer: Optional[int] = None,
    head: int = 1,
    formats: Sequence[str] = ("png", "svg"),
    max_length: int = 512,
    window: Optional[tuple[int, int]] = None,
    max_tokens: int = 128,
    title: Optional[str] = None,
    model_name: str = "model",
    rows: RowChoice = None,
) -> Inspection:
    """Capture the attention of ``text`` and write pictures and ``report.html`` into ``out``.

    Writes ``model.<fmt>`` (layers x heads), ``layer_<k>.<fmt>`` (one layer's heads) for
    every layer, ``head_L<layer>_H<head>.<fmt>`` and ``report.html``.

    Args:
        model: model to inspect (run in eval mode; its mode is restored).
        tokenizer: a ``tokenizers.Tokenizer``.
        text: the input.
        out: output directory (created).
        layer: 1-based layer of the single-head picture; default the last layer.
        head: 1-based head of the single-head picture.
        formats: picture formats, ``png`` and/or ``svg``.
        max_length: tokens kept from the text.
        window: ``(start, stop)`` positions shown in the single-head picture.
        max_tokens: beyond this many positions pictures and report pool positions.
        title: report title.
        model_name: shown in the report.
        rows: draw only these query rows' weights over every key (the last ``k``, a slice,
            or positions; :mod:`~attnlab.inspect.compute.query_rows`): no ``[T, T]`` map
            is made, so a long text fits. The maps are then ``[H, R, T]``, their rows
            labelled with their positions; the rollout and the decoder's per-prefix
            statistics, which need every row, are left out.
    """
    out = Path(out)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1 (positions shown before pooling), got {max_tokens!r}")
    require(inspectable(model), "one_sequence", "the report")
    input_ids, tokens = encode_text(tokenizer, text, max_length)
    if window is not None:
        start, stop = window
        if not 0 <= start < stop or start >= len(tokens):
            raise ValueError(f"window must be (start, stop) with 0 <= start < stop and start below the text's "
                             f"{len(tokens)} tokens, got {tuple(window)}")
    mask = torch.ones_like(input_ids, dtype=torch.bool)  # [1, T]
    positions = None
    with torch.no_grad(), (capture_attention(model) if rows is None else
                           inspectable(model).record(rows=check_rows(rows))) as captured:
        forward_batch(model, {"input_ids": input_ids, "mask": mask})
    attentions = {name: weights[0].float() for name, weights in captured.attentions.items()}  # [H, T|R, T]
    if rows is not None:
        positions = next(iter(captured.query_rows.values())).tolist()
    names = list(attentions.keys())
    layer = len(names) if layer is None else layer
    if not 1 <= layer <= len(names):
        raise ValueError(f"layer must lie in 1..{len(names)}, got {layer}")
    heads = attentions[names[layer - 1]].shape[0]
    if not 1 <= head <= heads:
        raise ValueError(f"head must lie in 1..{heads}, got {head}")
    out.mkdir(parents=True, exist_ok=True)  # only once everything asked for is known to be drawable

    statistics = HeadStatistics(token_groups=special_token_groups(tokenizer))
    for name, weights in attentions.items():
        square = weights.shape[-1] == weights.shape[-2]
        for first, stop in _runs(positions) if positions is not None else [(0, weights.shape[-2])]:
            start = first if positions is None else positions[first]  # the run's first query position
            statistics.update(
                name,
                weights[None, :, first:stop],
                mask[:, start:start + stop - first],
                mask if square or positions is not None else torch.ones(1, weights.shape[-1], dtype=torch.bool),
                input_ids=input_ids,
                query_start=start,
            )
    means = statistics.means()
    tables = {stat: [means[name][stat] for name in names] for stat in next(iter(means.values()))}
    meta = {"model": model_name, "text": text, "tokens": str(len(tokens))}
    rollout, queries, sides, shown = None, tokens, {}, ""
    if positions is not None:  # rows labelled with their positions, over every key
        queries = [f"{position}: {tokens[position]}" for position in positions]
        sides = {"key_tokens": tokens, "sides": ("chosen query rows", "keys")}
        meta["query rows"] = f"{len(positions)} of {len(tokens)} query rows ({_ranges(positions)})"
        shown = f": {meta['query rows']}"
        window = None
    else:  # the decoder's per-prefix statistics and the rollout need every row
        if callable(getattr(model, "new_cache", None)):  # a decoder: statistics over each query's allowed prefix
            causal = causal_statistics({name: weights[None] for name, weights in attentions.items()})
            tables = {**{stat: [causal[stat][name] for name in names] for stat in CAUSAL_STATISTICS},
                      **{stat: values for stat, values in tables.items() if stat not in CAUSAL_STATISTICS}}
        square = all(weights.shape[-1] == weights.shape[-2] == len(tokens) for weights in attentions.values())
        rollout = attention_rollout({n: w[None] for n, w in attentions.items()}, mask)[:, 0] if square else None

    figures: list[Path] = []
    figures += save_figure(
        plot_model(attentions, title=f"{model_name}{shown or ': attention per layer and head'}"), out / "model",
        formats,
    )
    key_tokens = sides.get("key_tokens")
    for index, name in enumerate(names, 1):
        figure = plot_layer(attentions[name], queries, key_tokens=key_tokens, title=f"{name}{shown}",
                            max_tokens=min(max_tokens, 64))
        figures += save_figure(figure, out / f"layer_{index}", formats)
    figure = plot_head(
        attentions[names[layer - 1]][head - 1],
        queries,
        key_tokens=key_tokens,
        title=f"{names[layer - 1]}, head {head}{shown}",
        window=window,
        max_tokens=max_tokens,
    )
    figures += save_figure(figure, out / f"head_L{layer}_H{head}", formats)
    report = write_report(
        out / "report.html",
        attentions,
        queries,
        title=title or "attnlab attention report",
        meta=meta,
        statistics=tables,
        rollout=rollout,
        max_tokens=max_tokens,
        **sides,
    )
    return Inspection(report=report, figures=figures, tokens=tokens, attentions=attentions)


def _runs(positions: Sequence[int]) -> list[tuple[int, int]]:
    """``[(first, stop), ...]``: spans of ``positions`` (indices into it) whose positions
    follow each other (``10, 11, 12``)."""
    runs: list[tuple[int, int]] = []
    for index, position in enumerate(positions):
        if runs and position == positions[index - 1] + 1:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _ranges(positions: Sequence[int]) -> str:
    """``"0, 10-19, 4095"``: positions as ranges."""
    return ", ".join(str(positions[first]) if stop == first + 1 else f"{positions[first]}-{positions[stop - 1]}"
                     for first, stop in _runs(positions))
