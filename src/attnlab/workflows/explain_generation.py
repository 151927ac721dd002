"""Prompts in, what made each generated token out: ``attnlab explain --prompt`` on a decoder.

Dimension letters: ``N`` tokens (prompt + generated), ``P`` prompt length, ``G`` generated tokens.

:func:`explain_generation` continues each prompt (greedy) or takes the given continuation,
then scores every earlier token for each generated token by every method of
:mod:`~attnlab.inspect.compute.generation_attribution`, and reads the logit lens at the
positions that predicted them. A contrastive question (``target`` and ``foil``, one token
each) explains ``log p(target) - log p(foil)`` at the token after the prompt.
:func:`write_generation_explanations` writes ``explanation.json`` (every prompt),
``explanation.png`` (prompt x generated tokens, one panel per method), ``logit_lens.png``
and the offline page ``explanation.html`` per prompt (``-2``, ``-3``, ... after the first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from .._files import write_json
from ..inspect.compute.generation_attribution import (ATTENTION_ONLY_METHODS, DEFAULT_GENERATION_METHODS,
                                                      attribute_generation, check_generation_methods)
from ..inspect.compute.inspectable import inspectable
from ..inspect.compute.integrated_gradients_baseline import DEFAULT_BASELINE, check_baseline
from ..inspect.compute.integrated_gradients_steps import (AUTO_STEPS, COMPLETENESS_TOLERANCE, IG,
                                                          completeness_note, row_gaps, until_complete)
from ..inspect.compute.logit_lens import logit_lens
from ..inspect.draw.generation_explanation import (generation_explanation_fragment,
                                                   plot_generation_attribution, render_generation_explanation)
from ..inspect.draw.logit_lens import plot_logit_lens
from ..inspect.draw.plots import save_figure
from ..inspect.faithfulness import model_family
from ..inspect.faithfulness_notes import faithfulness_notes

__all__ = ["GenerationExplanation", "explain_generation", "write_generation_explanations", "context_limit", "lens_table",
           "neutral_token_id"]

_LENS_TOP = 5


@dataclass
class GenerationExplanation:
    """One prompt's explanation.

    Attributes:
        prompt: the prompt text.
        tokens: the ``N`` tokens as text, prompt first.
        token_ids: their ids.
        prompt_length: ``P``.
        scores: ``{method: [G][N]}``; row ``g`` scores positions ``0 .. P + g - 1`` (zeros after).
        objective: ``[G]`` the explained quantity of each generated token.
        objective_name: ``"log p(token)"`` or ``"log p(target) - log p(foil)"``.
        foil: the foil token's text, for a contrastive question.
        lens: the logit lens at each predicting position (see
            :func:`~attnlab.inspect.draw.generation_explanation.render_generation_explanation`).
        integrated_gradients_delta: ``[G]`` completeness error, when integrated gradients ran.
        integrated_gradients_steps: its quadrature points; integrated_gradients_gap: its largest
            completeness gap (:mod:`~attnlab.inspect.compute.integrated_gradients_steps`);
            integrated_gradients_gaps: ``[G]`` each generated token's gap.
        integrated_gradients_baseline: its baseline (``"pad"``, ``"zero"`` or ``"mean"``).
        attn_lrp_logit, attn_lrp_sum: ``[G]`` the logit (difference) ``attn-lrp`` explains and
            its relevances' sum, when it ran.
        faithfulness: each method's measured faithfulness on a decoder of this family
            (:func:`~attnlab.inspect.faithfulness_notes.faithfulness_notes`).
    """

    prompt: str
    tokens: list[str]
    token_ids: list[int]
    prompt_length: int
    scores: dict[str, list[list[float]]] = field(default_factory=dict)
    objective: list[float] = field(default_factory=list)
    objective_name: str = "log p(token)"
    foil: Optional[str] = None
    lens: Optional[dict[str, Any]] = None
    integrated_gradients_delta: Optional[list[float]] = None
    integrated_gradients_steps: Optional[int] = None
    integrated_gradients_gap: Optional[float] = None
    integrated_gradients_gaps: Optional[list[float]] = None
    integrated_gradients_baseline: Optional[str] = None
    attn_lrp_logit: Optional[list[float]] = None
    attn_lrp_sum: Optional[list[float]] = None
    faithfulness: Optional[dict[str, Any]] = None

    def completeness(self) -> Optional[str]:
        """Integrated gradients' points, baseline and largest completeness gap in one line
        (a warning over 5 %)."""
        if self.integrated_gradients_steps is None:
            return None
        return completeness_note(self.integrated_gradients_steps, self.integrated_gradients_gap,
                                 self.integrated_gradients_baseline)

    @property
    def generated(self) -> list[str]:
        return self.tokens[self.prompt_length:]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; each method's rows cut to the positions the token could see."""
        P = self.prompt_length
        return {
            "prompt": self.prompt, "tokens": self.tokens, "token_ids": self.token_ids, "prompt_length": P,
            "generated": self.generated, "objective_name": self.objective_name, "objective": self.objective,
            "foil": self.foil, "methods": list(self.scores),
            "scores": {name: [row[: P + g] for g, row in enumerate(rows)] for name, rows in self.scores.items()},
            "attention_only_methods": [name for name in self.scores if name in ATTENTION_ONLY_METHODS],
            "integrated_gradients_delta": self.integrated_gradients_delta,
            "integrated_gradients_steps": self.integrated_gradients_steps,
            "integrated_gradients_completeness_gap": self.integrated_gradients_gap,
            "integrated_gradients_completeness_gaps": self.integrated_gradients_gaps,
            "integrated_gradients_baseline": self.integrated_gradients_baseline,
            "integrated_gradients_complete": None if self.integrated_gradients_gap is None
            else self.integrated_gradients_gap <= COMPLETENESS_TOLERANCE,
            "integrated_gradients_note": self.completeness(),
            "attn_lrp_logit": self.attn_lrp_logit, "attn_lrp_sum": self.attn_lrp_sum, "logit_lens": self.lens,
            "faithfulness": self.faithfulness,
        }

    def page(self, *, model_name: str = "model") -> str:
        """The offline page (``explanation.html``)."""
        meta = {"model": model_name, "prompt": self.prompt, "generated": "".join(self.generated),
                "explained": self.objective_name + (f", foil {self.foil!r}" if self.foil else "")}
        if self.foil:
            meta["note"] = "raw and rollout read attention only: the same scores as without a foil"
        if self.completeness() is not None:
            meta["integrated gradients"] = self.completeness()
        return render_generation_explanation(self.tokens, self.prompt_length, self.scores, objective=self.objective,
                                             objective_name=self.objective_name, lens=self.lens, meta=meta,
                                             faithfulness=self.faithfulness)

    def _repr_html_(self) -> str:
        return generation_explanation_fragment(self.page())


def context_limit(model: nn.Module) -> Optional[int]:
    """The positions a decoder takes: attnlab's ``config.max_len``, transformers' ``max_position_embeddings``."""
    config = getattr(model, "config", None)
    for name in ("max_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def neutral_token_id(model: nn.Module) -> int:
    """The token occlusion and integrated gradients put in place of a token: the padding id, else
    the end-of-text id, else 0."""
    config = getattr(model, "config", None)
    for name in ("pad_id", "pad_token_id", "eos_id", "eos_token_id"):
        value = getattr(config, name, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([token], skip_special_tokens=False) for token in ids]


def _one_token(tokenizer: Any, text: Optional[str], argument: str) -> Optional[int]:
    if text is None:
        return None
    ids = tokenizer.encode(text, add_special_tokens=False).ids  # a token, without the prompt's <bos>
    if len(ids) != 1:
        raise ValueError(f"{argument} {text!r} is {len(ids)} tokens; a contrastive question compares single "
                         f"tokens (a leading space often makes a word one token: {' ' + text.strip()!r})")
    return ids[0]


def _continue(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
    """Greedy continuation, cut after the first end-of-text token."""
    view = inspectable(model)
    # only the tokens: no weights recorded (the native decoding step serves where it can)
    sequences = view.generate(input_ids, max_new_tokens=max_new_tokens, output_attentions=False).sequences
    new = sequences[0, input_ids.shape[1]:].tolist()
    stops = set(view.special_ids["eos"])
    for index, token in enumerate(new):
        if token in stops:
            return new[: index + 1]
    return new


def _lens_data(model: nn.Module, tokenizer: Any, ids: torch.Tensor, P: int) -> dict[str, Any]:
    N = ids.shape[1]
    lens = logit_lens(model, ids, positions=torch.arange(P - 1, N - 1), top_k=_LENS_TOP)
    texts = {}
    for token in lens.top_ids.flatten().tolist():
        if token not in texts:
            texts[token] = tokenizer.decode([token], skip_special_tokens=False)
    return {
        "layers": lens.layers,
        "top": [[[{"token": texts[t], "probability": round(float(p), 6)} for t, p in zip(ts, ps)]
                 for ts, ps in zip(layer_ids.tolist(), layer_probs.tolist())]
                for layer_ids, layer_probs in zip(lens.top_ids, lens.top_probabilities)],
        "rank": lens.target_ranks.tolist(),
        "probability": [[round(float(v), 6) for v in row] for row in lens.target_probabilities.tolist()],
    }


def explain_generation(
    model: nn.Module,
    tokenizer: Any,
    prompts: Union[str, Sequence[str]],
    methods: Sequence[str] = DEFAULT_GENERATION_METHODS,
    *,
    continuation: Optional[str] = None,
    max_new_tokens: int = 8,
    target: Optional[str] = None,
    foil: Optional[str] = None,
    steps: Optional[int] = None,
    neutral_id: Optional[int] = None,
    baseline: str = DEFAULT_BASELINE,
    lens: bool = True,
    names: Optional[dict[str, str]] = None,
) -> list[GenerationExplanation]:
    """Explain what a decoder generates after each prompt.

    Args:
        model: attnlab's decoder or a :class:`~attnlab.hf.opening.TransformersModel` language model.
        tokenizer: its tokenizer.
        prompts: one prompt or several (each explained on its own).
        methods: names from :data:`~attnlab.inspect.compute.generation_attribution.GENERATION_METHODS`.
        continuation: explain this text after every prompt instead of the model's own
            continuation (tokenized on its own: start it with a space where a word follows).
        max_new_tokens: tokens generated when no continuation is given.
        target: one token explained after the prompt (with ``foil``: "why target and not foil");
            default the model's own next token.
        foil: one token to contrast with.
        steps: integrated gradients' quadrature points; default: from 50, doubled until the
            completeness gap is under 5 % (:func:`~attnlab.inspect.compute.integrated_gradients_steps.until_complete`).
        neutral_id: occlusion's replacement and integrated gradients' baseline token (default
            :func:`neutral_token_id`).
        baseline: integrated gradients' starting point: ``"pad"`` (the neutral token's embedding),
            ``"zero"`` (the zero vector) or ``"mean"`` (the mean embedding), at the token
            embedding's output (:mod:`~attnlab.inspect.compute.integrated_gradients_baseline`).
        lens: also read the logit lens at the predicting positions.
        names: how the caller names the arguments in messages (the CLI: ``{"prompts": "--prompt", ...}``).

    Returns:
        one :class:`GenerationExplanation` per prompt.

    Raises:
        ValueError: before any work, when a prompt (plus what is explained) is longer than
            the model takes, a target or foil is not one token, or the arguments clash.
    """
    named = {"prompts": "prompts", "continuation": "continuation", "target": "target", "foil": "foil",
             "max_new_tokens": "max_new_tokens", **(names or {})}
    methods = check_generation_methods(methods)
    check_baseline(baseline, named.get("baseline", "baseline"))
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or any(not isinstance(p, str) or not p for p in prompts):
        raise ValueError(f"{named['prompts']} must be one or more non-empty strings, got {prompts!r}")
    if continuation is not None and (target is not None or foil is not None):
        raise ValueError(f"give {named['continuation']} or {named['target']}/{named['foil']}, not both")
    if continuation is not None and not continuation:
        raise ValueError(f"{named['continuation']} must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"{named['max_new_tokens']} must be an int >= 1, got {max_new_tokens!r}")
    target_id = _one_token(tokenizer, target, named["target"])
    foil_id = _one_token(tokenizer, foil, named["foil"])
    # text after the prompt: no <bos> (Gemma's tokenizer adds one to every text it encodes)
    given = tokenizer.encode(continuation, add_special_tokens=False).ids if continuation is not None else None
    if given is not None and not given:
        raise ValueError(f"the tokenizer produced no token for {named['continuation']} {continuation!r}")
    explained = len(given) if given is not None else 1 if (target_id is not None or foil_id is not None) \
        else max_new_tokens
    limit = context_limit(model)
    encoded = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt).ids
        if not ids:
            raise ValueError(f"the tokenizer produced no token for {named['prompts']} {prompt!r}")
        if limit is not None and len(ids) + explained > limit:
            raise ValueError(f"{named['prompts']} {prompt[:40]!r}{'…' if len(prompt) > 40 else ''} has {len(ids)} "
                             f"tokens and {explained} more are explained, past the {limit} positions the model "
                             f"takes; shorten {named['prompts']} to at most {limit - explained} tokens")
        encoded.append(ids)
    neutral = neutral_token_id(model) if neutral_id is None else neutral_id
    results = []
    for prompt, ids in zip(prompts, encoded):
        prompt_ids = torch.tensor([ids])
        if given is not None:
            new = list(given)
        elif target_id is not None:
            new = [target_id]
        else:
            with torch.no_grad():
                new = _continue(model, prompt_ids, 1 if foil_id is not None else max_new_tokens)
        full = torch.tensor([ids + new])
        P = len(ids)
        foils = None if foil_id is None else torch.full((len(new),), foil_id)
        first = AUTO_STEPS[0] if steps is None else steps
        found = attribute_generation(model, full, P, methods, foil_ids=foils, neutral_id=neutral,
                                     baseline=baseline, steps=first)
        integrated = None
        if found.delta is not None:
            def run(points: int) -> tuple:  # called at once, in this iteration
                again = found if points == first else attribute_generation(
                    model, full, P, [IG], foil_ids=foils, neutral_id=neutral, baseline=baseline,
                    steps=points)
                return again, again.scores[IG], again.delta

            integrated, used, gap = until_complete(run, steps)
            found.scores[IG], found.delta = integrated.scores[IG], integrated.delta
        explanation = GenerationExplanation(
            prompt, _token_texts(tokenizer, ids + new), ids + new, P,
            {name: [[round(float(v), 6) for v in row] for row in found.scores[name].tolist()] for name in methods},
            [float(v) for v in found.objective],
            "log p(target) - log p(foil)" if foil_id is not None else "log p(token)",
            None if foil_id is None else tokenizer.decode([foil_id], skip_special_tokens=False),
        )
        if integrated is not None:
            explanation.integrated_gradients_delta = [float(v) for v in found.delta]
            explanation.integrated_gradients_steps, explanation.integrated_gradients_gap = used, gap
            explanation.integrated_gradients_gaps = row_gaps(found.scores[IG], found.delta)
            explanation.integrated_gradients_baseline = baseline
        if found.attn_lrp_logit is not None:
            explanation.attn_lrp_logit = [float(v) for v in found.attn_lrp_logit]
            explanation.attn_lrp_sum = [float(v) for v in found.attn_lrp_sum]
        if lens:
            explanation.lens = _lens_data(model, tokenizer, full, P)
        explanation.faithfulness = faithfulness_notes("decoder", model_family(model), methods)
        results.append(explanation)
    return results


def lens_table(explanation: GenerationExplanation) -> str:
    """The logit lens as text: one line per layer, one cell per generated token (top token,
    then the generated token's rank and probability)."""
    if explanation.lens is None:
        return ""
    lens = explanation.lens
    cells = [["after"] + [repr(token) for token in explanation.generated]]
    for l, layer in enumerate(lens["layers"]):
        cells.append([layer] + [f"{lens['top'][l][g][0]['token']!r} | #{lens['rank'][l][g]} "
                                f"p={lens['probability'][l][g]:.3f}" for g in range(len(explanation.generated))])
    widths = [max(len(row[c]) for row in cells) for c in range(len(cells[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)


def write_generation_explanations(
    explanations: Sequence[GenerationExplanation], out: Union[str, Path], *, model_name: str = "model"
) -> list[Path]:
    """Write ``explanation.json`` and, per prompt, ``explanation[-k].png``, ``explanation[-k].html``
    and ``logit_lens[-k].png`` into ``out``; returns the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "explanation.json", {"model": model_name, "prompts": [e.to_dict() for e in explanations]})
    written = [out / "explanation.json"]
    for index, explanation in enumerate(explanations):
        suffix = "" if index == 0 else f"-{index + 1}"
        figure = plot_generation_attribution(explanation.tokens, explanation.prompt_length, explanation.scores,
                                             title=f"{model_name}: {explanation.objective_name}")
        written += save_figure(figure, out / f"explanation{suffix}", ("png",))
        page = out / f"explanation{suffix}.html"
        page.write_text(explanation.page(model_name=model_name), encoding="utf-8")
        written.append(page)
        if explanation.lens is not None:
            lens = explanation.lens
            figure = plot_logit_lens(lens["probability"], [[row[0]["token"] for row in layer] for layer in lens["top"]],
                                     lens["layers"], [repr(token) for token in explanation.generated],
                                     title=f"{model_name}: logit lens (cell: most likely token after the layer)")
            written += save_figure(figure, out / f"logit_lens{suffix}", ("png",))
    return written
