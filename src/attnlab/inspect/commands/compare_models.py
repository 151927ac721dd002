"""Two models on the same texts: per-head statistics side by side, what ``attnlab compare`` does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from torch import nn

from ..._files import write_json
from ..compute.analyzer import AttentionStatistics
from ..compute.comparison import compare_statistics
from ..draw.comparison import comparison_fragment, render_comparison
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
        **options: passed to :func:`~attnlab.inspect.commands.analyze_texts.analyze_rows`
            (``batch_size``, ``max_length``, ``importance``, ...).
    """
    if options.get("importance"):  # both models checked before either is analysed
        for label, name, model in (("A", names[0], model_a), ("B", names[1], model_b)):
            try:
                check_importance_inputs(model, rows)
            except ValueError as error:
                raise ValueError(f"model {label} ({name}): {error}") from None
    a = analyze_rows(model_a, tokenizer_a, rows, **options)
    b = analyze_rows(model_b, tokenizer_b, rows, **options)
    return Comparison(compare_statistics(a, b, names=names), a, b)


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
