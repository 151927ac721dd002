"""One text in, every attribution method's per-token scores out: what ``attnlab explain`` does.

:func:`explain` computes (Python API); :func:`write_explanation` writes
``explanation.json`` (strict JSON: tokens, target, each method's scores),
``explanation.png`` (methods x tokens) and ``explanation.html`` (methods as highlighted
text side by side, offline). An :class:`Explanation` shows itself inline in Jupyter
and VS Code (``_repr_html_``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from .._files import write_json
from ..inspect.compute.attribution_target import is_causal_model, logits_of
from ..inspect.compute.integrated_gradients_baseline import DEFAULT_BASELINE, check_baseline
from ..inspect.compute.integrated_gradients_steps import (AUTO_STEPS, COMPLETENESS_TOLERANCE, IG,
                                                          completeness_note, until_complete)
from ..inspect.compute.token_attribution import DEFAULT_METHODS, attribute_tokens, check_methods
from ..inspect.faithfulness import model_family
from ..inspect.faithfulness_notes import faithfulness_notes
from ..inspect.draw.explanation import explanation_fragment, plot_explanation, render_explanation
from ..inspect.draw.plots import save_figure
from .inspect_text import encode_text

__all__ = ["Explanation", "explain", "write_explanation", "baseline_for"]


@dataclass
class Explanation:
    """Per-token scores of one text for each method.

    Attributes:
        text: the input text.
        tokens: its ``T`` tokens.
        scores: ``{method: [T] floats}``.
        target: the explained class index (``None`` for a bare encoder).
        target_name: its label name, when the model has them.
        probabilities: the model's class probabilities, when it has logits.
        integrated_gradients_delta: completeness error of integrated gradients, when run.
        integrated_gradients_steps: its quadrature points; integrated_gradients_gap: its
            completeness gap (:mod:`~attnlab.inspect.compute.integrated_gradients_steps`).
        integrated_gradients_baseline: its baseline (``"pad"``, ``"zero"`` or ``"mean"``).
        attn_lrp_logit, attn_lrp_sum: the class logit ``attn-lrp`` explains and its relevances'
            sum (the gap is what biases and the softmax's rule absorbed), when it ran.
        explained_position: the query position whose attention ``raw``, ``rollout`` and
            ``flow`` read when no class is explained: ``"pooled position"``, or for a causal
            decoder the last token (the one that predicts the next token).
        faithfulness: each method's measured faithfulness on a model of this kind
            (:func:`~attnlab.inspect.faithfulness_notes.faithfulness_notes`); ``None`` when nothing
            was measured (a bare encoder explains no prediction).
    """

    text: str
    tokens: list[str]
    scores: dict[str, list[float]] = field(default_factory=dict)
    target: Optional[int] = None
    target_name: Optional[str] = None
    probabilities: Optional[list[float]] = None
    integrated_gradients_delta: Optional[float] = None
    integrated_gradients_steps: Optional[int] = None
    integrated_gradients_gap: Optional[float] = None
    integrated_gradients_baseline: Optional[str] = None
    attn_lrp_logit: Optional[float] = None
    attn_lrp_sum: Optional[float] = None
    explained_position: str = "pooled position"
    faithfulness: Optional[dict[str, Any]] = None

    def completeness(self) -> Optional[str]:
        """Integrated gradients' points, baseline and completeness gap in one line (a warning over 5 %)."""
        if self.integrated_gradients_steps is None:
            return None
        return completeness_note(self.integrated_gradients_steps, self.integrated_gradients_gap,
                                 self.integrated_gradients_baseline)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON values (``explanation.json``)."""
        return {
            "text": self.text,
            "tokens": self.tokens,
            "target": self.target,
            "target_name": self.target_name,
            "probabilities": self.probabilities,
            "methods": list(self.scores),
            "scores": self.scores,
            "integrated_gradients_delta": self.integrated_gradients_delta,
            "integrated_gradients_steps": self.integrated_gradients_steps,
            "integrated_gradients_completeness_gap": self.integrated_gradients_gap,
            "integrated_gradients_baseline": self.integrated_gradients_baseline,
            "integrated_gradients_complete": None if self.integrated_gradients_gap is None
            else self.integrated_gradients_gap <= COMPLETENESS_TOLERANCE,
            "integrated_gradients_note": self.completeness(),
            "attn_lrp_logit": self.attn_lrp_logit,
            "attn_lrp_sum": self.attn_lrp_sum,
            "explained_position": self.explained_position,
            "faithfulness": self.faithfulness,
        }

    def describe_target(self) -> str:
        """One line for people: the explained class, its name and probability."""
        if self.target is None:
            return f"attention of the {self.explained_position}"
        name = f" ({self.target_name})" if self.target_name else ""
        probability = f", p = {self.probabilities[self.target]:.3f}" if self.probabilities is not None else ""
        return f"explained class {self.target}{name}{probability}"

    def _repr_html_(self) -> str:
        return explanation_fragment(self.tokens, self.scores, caption=self.describe_target(),
                                    faithfulness=self.faithfulness)


def baseline_for(input_ids: torch.Tensor, tokenizer: Any, pad_id: int) -> torch.Tensor:
    """Integrated gradients' reference: pad ids, keeping the tokenizer's special tokens."""
    vocabulary = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    special = {
        index
        for token, index in vocabulary.items()
        if token in ("[CLS]", "[SEP]", "<s>", "</s>", "[BOS]", "[EOS]")
    }
    baseline = torch.full_like(input_ids, pad_id)
    keep = torch.tensor([[int(i) in special for i in row] for row in input_ids.tolist()], dtype=torch.bool)
    return torch.where(keep, input_ids, baseline)


def explain(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    methods: Sequence[str] = DEFAULT_METHODS,
    *,
    target: Optional[Union[int, str]] = None,
    max_length: int = 512,
    steps: Optional[int] = None,
    baseline: str = DEFAULT_BASELINE,
) -> Explanation:
    """Score every token of ``text`` with each method, for the predicted (or given) class.

    Args:
        model: an attnlab classifier (every method) or encoder (``raw``, ``rollout``, ``flow``).
        tokenizer: the model's tokenizer (``attnlab.load`` gives it).
        text: the input.
        methods: names among :data:`~attnlab.inspect.compute.token_attribution.METHODS`.
        target: class index or label name; default the predicted class.
        max_length: tokens kept from the text.
        steps: integrated gradients' quadrature points; default: from 50, doubled until the
            completeness gap is under 5 % (:func:`~attnlab.inspect.compute.integrated_gradients_steps.until_complete`).
        baseline: integrated gradients' starting point: ``"pad"`` (the pad token's embedding),
            ``"zero"`` (the zero vector) or ``"mean"`` (the mean embedding); ``[CLS]``/``[SEP]``
            keep their own embedding under each
            (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).

    Example:
        >>> model, tokenizer, _ = attnlab.load("runs/demo")
        >>> explain(model, tokenizer, "a gripping, funny film").scores["rollout"]
    """
    methods = check_methods(methods)
    check_baseline(baseline)
    input_ids, tokens = encode_text(tokenizer, text, max_length)
    encoder = getattr(model, "encoder", model)
    pad_id = getattr(getattr(encoder, "config", None), "pad_id", None)
    reference = baseline_for(input_ids, tokenizer, 0 if pad_id is None else pad_id)
    first = AUTO_STEPS[0] if steps is None else steps
    result = attribute_tokens(model, input_ids, methods, target=target, baseline_ids=reference,
                               baseline=baseline, steps=first)
    explanation = Explanation(text, tokens, {name: result.scores[name][0].tolist() for name in methods})
    if result.delta is not None:
        def run(points: int) -> tuple:
            found = result if points == first else attribute_tokens(
                model, input_ids, [IG], target=int(result.target[0]), baseline_ids=reference,
                baseline=baseline, steps=points)
            return found, found.scores[IG], found.delta

        integrated, explanation.integrated_gradients_steps, explanation.integrated_gradients_gap = until_complete(
            run, steps)
        explanation.scores[IG] = integrated.scores[IG][0].tolist()
        explanation.integrated_gradients_delta = float(integrated.delta[0])
        explanation.integrated_gradients_baseline = baseline
    if result.attn_lrp_logit is not None:
        explanation.attn_lrp_logit = float(result.attn_lrp_logit[0])
        explanation.attn_lrp_sum = float(result.attn_lrp_sum[0])
    if is_causal_model(model):  # row 0 of a causal model sees only itself: read the last token's row
        explanation.explained_position = f"last token, {tokens[-1]!r}, which predicts the next token"
    if result.target is not None:
        explanation.target = int(result.target[0])
        names = getattr(model, "label_names", None)
        explanation.target_name = names[explanation.target] if names else None
        logits = result.logits
        if logits is None:  # integrated gradients alone runs no plain forward
            with torch.no_grad():
                logits = logits_of(model(input_ids))
        explanation.probabilities = torch.softmax(logits[0].float(), -1).tolist()
        explanation.faithfulness = faithfulness_notes("classifier", model_family(model), list(explanation.scores))
    return explanation


def write_explanation(
    explanation: Explanation, out: Union[str, Path], *, model_name: str = "model"
) -> list[Path]:
    """Write ``explanation.json``, ``explanation.png`` and ``explanation.html`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "explanation.json", {"model": model_name, **explanation.to_dict()})
    figure = plot_explanation(
        explanation.tokens, explanation.scores, title=f"{model_name}: {explanation.describe_target()}"
    )
    written = [out / "explanation.json"] + save_figure(figure, out / "explanation", ("png",))
    meta = {"model": model_name, "text": explanation.text, "target": explanation.describe_target()}
    if explanation.completeness() is not None:
        meta["integrated gradients"] = explanation.completeness()
    page = render_explanation(explanation.tokens, explanation.scores, title="attnlab explanation", meta=meta,
                              faithfulness=explanation.faithfulness)
    (out / "explanation.html").write_text(page, encoding="utf-8")
    return written + [out / "explanation.html"]
