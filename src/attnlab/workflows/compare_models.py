"""Two models on the same texts: per-head statistics side by side, what ``attnlab compare`` does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from torch import nn

from .._files import write_json
from ..inspect.compute.analyzer import AttentionStatistics
from ..inspect.compute.comparison import compare_statistics
from ..inspect.draw.comparison import comparison_fragment, render_comparison
from .analyze_texts import analyze_rows, check_importance_inputs

__all__ = ["Comparison", "compare_models", "write_comparison"]


@dataclass
class Comparison:
    """Two models' statistics and their differences; shows itself inline in notebooks.

    Attributes:
        result: :func:`~attnlab.inspect.compute.comparison.compare_statistics`' dict.
        a: the first model's statistics; b: the second's.
    """

    result: dict[str, Any]
    a: AttentionStatistics
    b: AttentionStatistics

    def _repr_html_(self) -> str:
        return comparison_fragment(self.result)


def compare_models(
    model_a: nn.Module,
    tokenizer_a: Any,
    model_b: nn.Module,
    tokenizer_b: Any,
    rows: Sequence[tuple[str, Optional[int]]],
    *,
    names: tuple[str, str] = ("A", "B"),
    **options: Any,
) -> Comparison:
    """Analyse ``rows`` with each model (its own tokenizer) and line the statistics up.

    Args:
        model_a, tokenizer_a: the first model; model_b, tokenizer_b: the second.
        rows: ``[(text, label or None), ...]``.
        names: how the models are called in the result.
        **options: passed to :func:`~attnlab.workflows.analyze_texts.analyze_rows`
            (``batch_size``, ``max_length``, ``importance``, ...).
    """
    if options.get("importance"):  # both models checked before either is analysed
        for label, name, model in (("A", names[0], model_a), ("B", names[1], model_b)):
            try:
                check_importance_inputs(model, rows)
            except ValueError as error:
                raise ValueError(f"model {label} ({name}): {error}") from None
    _check_comparable(model_a, tokenizer_a, model_b, tokenizer_b, rows, names, options.get("max_length", 128))
    a = analyze_rows(model_a, tokenizer_a, rows, **options)
    b = analyze_rows(model_b, tokenizer_b, rows, **options)
    return Comparison(compare_statistics(a, b, names=names), a, b)


def _check_comparable(model_a: nn.Module, tokenizer_a: Any, model_b: nn.Module, tokenizer_b: Any,
                      rows: Sequence[tuple[str, Optional[int]]], names: tuple[str, str], max_length: int) -> None:
    """Head k of A is compared with head k of B, which means something for a model and its
    fine-tuned or pruned copy only: refuse models whose layers, heads or tokenizers differ
    (found on the first text, before the data set is analysed)."""
    if not rows:
        return
    shapes = [analyze_rows(model, tokenizer, rows[:1], batch_size=1, max_length=max_length)
              for model, tokenizer in ((model_a, tokenizer_a), (model_b, tokenizer_b))]
    a, b = ((statistics.layers, statistics.num_heads) for statistics in shapes)
    if a != b:
        def shape(layers: list, heads: Any) -> str:
            heads = list(heads) if isinstance(heads, (list, tuple)) else [heads] * len(layers)
            each = f"{heads[0]} heads each" if len(set(heads)) == 1 else f"{heads} heads"
            return f"{len(layers)} attention layers of {each}"

        raise ValueError(
            f"{names[0]} has {shape(*a)}, {names[1]} {shape(*b)}: "
            f"compare pairs each head with the same head of the other model, so both must have the same shape "
            f"(a model and its fine-tuned copy); analyze each with attnlab analyze instead")
    text = rows[0][0]
    tokens_a, tokens_b = (tokenizer.encode(text).ids for tokenizer in (tokenizer_a, tokenizer_b))
    if tokens_a != tokens_b:
        raise ValueError(
            f"{names[0]} and {names[1]} tokenize the texts differently ({len(tokens_a)} and {len(tokens_b)} tokens "
            f"for the first): their heads see different positions and cannot be paired; compare a model with its "
            f"fine-tuned copy, or analyze each with attnlab analyze")


def write_comparison(comparison: Comparison, out: Union[str, Path], *, data_name: str = "data") -> list[Path]:
    """Write ``comparison.json`` (strict JSON) and ``comparison.html`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "comparison.json", {"data": data_name, **comparison.result})
    a, b = comparison.result["models"]
    page = render_comparison(
        comparison.result,
        meta={"A": a, "B": b, "data": f"{data_name}: {comparison.a.examples} texts"},
    )
    (out / "comparison.html").write_text(page, encoding="utf-8")
    return [out / "comparison.json", out / "comparison.html"]
