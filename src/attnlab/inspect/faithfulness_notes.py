"""What an explanation says about its own methods: how faithful each measured on a model like this one.

``attnlab explain`` writes scores by several methods, and they do not deserve the same trust: on
SmolLM2 the faithfulness benchmark ranks some of them at or below a random ranking. This module
turns the packaged figures (:mod:`~attnlab.inspect.faithfulness`) into what an explanation
carries beside its scores: for each method shown, its figure on every measure with the random
ranking's beside it, and whether it measured at or below random on the primary one. It also
names a model's family (the key of those figures) and the method explain runs by default: the
best-ranked one the model offers. A model's family is
:func:`~attnlab.inspect.faithfulness.model_family`'s key.

Example::

    family = model_family(model)                      # "llama" for SmolLM2
    default_method("decoder", family, GENERATION_METHODS)
    faithfulness_notes("decoder", family, ["raw", "occlusion"])["methods"]["raw"]["at_or_below_random"]
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from .faithfulness import MEASURES, RANDOM, faithfulness_for

__all__ = ["default_method", "faithfulness_notes", "describe_method"]


def default_method(kind: str, family: Optional[str], available: Sequence[str]) -> Optional[str]:
    """The method ``explain`` runs when none is named: the one ranked best over the measures
    (:meth:`~attnlab.inspect.faithfulness.FamilyFaithfulness.best_method`) among ``available``, on this family's figures (another family's of the same kind when this
    one was not measured); ``None`` when nothing of ``available`` was measured for ``kind``.

    Args:
        kind: ``"decoder"`` or ``"classifier"``.
        family: :func:`~attnlab.inspect.faithfulness.model_family`'s key, or ``None``.
        available: the methods the model offers.
    """
    measured = faithfulness_for(kind, family)
    return None if measured is None else measured.best_method(available)


def faithfulness_notes(kind: str, family: Optional[str], methods: Sequence[str]) -> Optional[dict[str, Any]]:
    """What an explanation carries about its ``methods``' measured faithfulness (plain JSON).

    Args:
        kind: ``"decoder"`` or ``"classifier"``.
        family: :func:`~attnlab.inspect.faithfulness.model_family`'s key, or ``None``.
        methods: the methods whose scores are shown.
    Returns:
        ``None`` when nothing was measured for ``kind``; else ``{"measured_on", "family",
        "same_family", "quantity", "texts", "primary", "higher_is_better", "random": {measure:
        [mean, low, high]}, "methods": {method: {"figures": {measure: [mean, low, high]},
        "at_or_below_random": bool or None, "note": str}}}``; a method never measured has empty
        figures, ``at_or_below_random`` ``None`` and a note saying so.
    """
    measured = faithfulness_for(kind, family)
    if measured is None:
        return None
    measures = [name for name in MEASURES if name in measured.figures]
    notes: dict[str, Any] = {}
    for method in methods:
        figures = {name: measured.figures[name][method] for name in measures if method in measured.figures[name]}
        primary_measured = method in measured.figures.get(measured.primary, {})
        below = measured.at_or_below_random(method) if primary_measured else None
        notes[method] = {"figures": figures, "at_or_below_random": below,
                         "note": describe_method(measured, method) if primary_measured
                         else f"not measured on {measured.model}"}
    return {
        "measured_on": measured.model, "family": measured.family, "same_family": measured.same_family,
        "quantity": measured.quantity, "texts": measured.texts, "primary": measured.primary,
        "higher_is_better": {name: measured.higher_is_better.get(name, True) for name in measures},
        "random": {name: measured.figures[name][RANDOM] for name in measures if RANDOM in measured.figures[name]},
        "methods": notes,
    }


def describe_method(measured: Any, method: str) -> str:
    """One line for people: ``method``'s primary figure against random's, and the verdict.

    Args:
        measured: a :class:`~attnlab.inspect.faithfulness.FamilyFaithfulness`.
        method: a method measured on its primary measure.
    """
    measure = measured.primary
    mean, low, high = measured.figures[measure][method]
    random_mean, random_low, random_high = measured.figures[measure][RANDOM]
    where = measured.model if measured.same_family else f"{measured.model} (another {measured.kind} family)"
    verdict = ("AT OR BELOW RANDOM: do not trust its ranking" if measured.at_or_below_random(method)
               else "above random")
    direction = "higher" if measured.higher_is_better.get(measure, True) else "lower"
    label = measure.replace("_", " ").replace("aopc", "AOPC")
    return (f"{label} {mean:.3g} [{low:.3g}, {high:.3g}] against random {random_mean:.3g} "
            f"[{random_low:.3g}, {random_high:.3g}] ({direction} is more faithful; {measured.texts} texts, "
            f"{where}): {verdict}")
