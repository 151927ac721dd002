"""The explanation methods' measured faithfulness, read from ``faithfulness.json`` (package data).

``benchmarks/faithfulness.py --record PATH`` writes the file: for each model it measured (one
entry per model family), every method's mean and 95 % interval over the texts on each measure,
beside a random ranking's. This module only reads it::

    from attnlab.inspect.faithfulness import faithfulness_for

    measured = faithfulness_for("decoder", "llama")   # SmolLM2's figures
    measured.best_method(["raw", "occlusion"])        # the better of the two on the primary measure
    measured.at_or_below_random("rollout")            # its interval does not clear random's

A model of a family never measured gets the figures of another family of the same kind, marked
``same_family=False``: they say how a method did on *a* model of that kind, not on this one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any, Optional, Sequence

from torch import nn

__all__ = ["MEASURES", "FamilyFaithfulness", "faithfulness_for", "load_figures", "model_family"]

MEASURES = ("deletion_aopc", "insertion_aopc", "soft_comprehensiveness", "soft_sufficiency")
RANDOM = "random"  # the random ranking's row in every measure
KINDS = ("decoder", "classifier")


@dataclass
class FamilyFaithfulness:
    """One measured model's figures: ``figures[measure][method] = [mean, low, high]``.

    ``[low, high]`` is the 95 % interval of the mean over ``texts`` texts; ``"random"`` is the
    random ranking's row. ``higher_is_better[measure]`` says which way a measure points and
    ``primary`` is the measure that ranks methods. ``same_family`` is ``False`` when these are
    another family's figures, lent to a model of the same kind.
    """

    family: str
    kind: str
    model: str
    quantity: str
    texts: int
    figures: dict[str, dict[str, list[float]]]
    primary: str
    higher_is_better: dict[str, bool]
    same_family: bool = True

    def best_method(self, methods: Optional[Sequence[str]] = None) -> Optional[str]:
        """The method ranked best among ``methods`` (all measured ones when ``None``): the best mean
        rank over the measures, each ranking the candidates by their means, the primary measure's
        mean breaking ties. One measure alone can reward an artefact (deleting a decoder's first
        token moves its output whatever the token says: deletion AOPC favours attention to it);
        the ranks over all four do not. The random ranking is never chosen; ``None`` when none of
        ``methods`` was measured.

        Args:
            methods: the candidates, e.g. those a model offers; names never measured are skipped.
        Returns:
            a method name, or ``None``.
        """
        measured = self.figures.get(self.primary, {})
        candidates = [name for name in (measured if methods is None else methods)
                      if name != RANDOM and name in measured]
        if not candidates:
            return None
        ranks: dict[str, list[int]] = {name: [] for name in candidates}
        for measure, row in self.figures.items():
            sign = 1.0 if self.higher_is_better.get(measure, True) else -1.0
            ordered = sorted((name for name in candidates if name in row), key=lambda name: -sign * row[name][0])
            for rank, name in enumerate(ordered):
                ranks[name].append(rank)
        sign = 1.0 if self.higher_is_better.get(self.primary, True) else -1.0
        return min(candidates, key=lambda name: (sum(ranks[name]) / len(ranks[name]), -sign * measured[name][0]))

    def at_or_below_random(self, method: str, measure: Optional[str] = None) -> bool:
        """Whether ``method``'s 95 % interval on ``measure`` fails to clear the random ranking's.

        For a higher-is-better measure the method clears random when its low end is above
        random's high end; for a lower-is-better one when its high end is below random's low end.

        Args:
            method: a measured method's name.
            measure: one of :data:`MEASURES` (default: ``primary``).
        Returns:
            ``True`` when the intervals overlap or the method is on random's wrong side.
        Raises:
            ValueError: for a measure or method with no figures here.
        """
        measure = measure or self.primary
        if measure not in self.figures:
            raise ValueError(f"measure {measure!r} has no figures for {self.model}; "
                             f"expected one of {sorted(self.figures)}")
        row = self.figures[measure]
        if method not in row or RANDOM not in row:
            raise ValueError(f"method {method!r} was not measured on {measure} for {self.model}; "
                             f"expected one of {sorted(row)}")
        _, low, high = row[method]
        _, random_low, random_high = row[RANDOM]
        if self.higher_is_better.get(measure, True):
            return not low > random_high
        return not high < random_low

    def to_json(self) -> dict[str, Any]:
        """The entry as plain JSON types (for the explorer page and ``--json`` outputs)."""
        return asdict(self)


def load_figures() -> dict[str, Any]:
    """The packaged ``faithfulness.json`` as written by ``benchmarks/faithfulness.py --record``."""
    return json.loads(_packaged_text())


@lru_cache(maxsize=1)
def _packaged_text() -> str:
    return files(__package__).joinpath("faithfulness.json").read_text(encoding="utf-8")


def faithfulness_for(kind: str, family: Optional[str] = None) -> Optional[FamilyFaithfulness]:
    """The measured figures for a model of ``kind`` and ``family``.

    Args:
        kind: ``"decoder"`` or ``"classifier"``; any other kind (a bare encoder explains no
            prediction) has nothing measured.
        family: the model's family key (``config.model_type`` for transformers models, e.g.
            ``"llama"``, ``"gemma3_text"``, ``"bert"``); ``None`` when unknown.
    Returns:
        that family's entry; else the first entry of ``kind`` with ``same_family=False``; else ``None``.
    """
    data = load_figures()
    entries = [entry for entry in data.get("families", []) if entry.get("kind") == kind]
    if not entries:
        return None
    chosen = next((entry for entry in entries if entry.get("family") == family), None)
    same_family = chosen is not None
    chosen = chosen or entries[0]
    directions = {name: bool(about.get("higher_is_better", True))
                  for name, about in data.get("measures", {}).items()}
    return FamilyFaithfulness(
        family=chosen["family"], kind=chosen["kind"], model=chosen["model"], quantity=chosen["quantity"],
        texts=int(chosen["texts"]), figures=chosen["figures"], primary=data.get("primary", MEASURES[0]),
        higher_is_better=directions,
        same_family=same_family)


def model_family(model: nn.Module) -> Optional[str]:
    """The family key of ``model``, as ``faithfulness.json`` names families.

    A transformers model (bare or opened by attnlab) gives its ``config.model_type``; attnlab's
    decoder the HuggingFace type of the checkpoint it was read from, else the one its architecture
    matches (rotary positions: ``"llama"``, learned: ``"gpt2"``); attnlab's encoder models ``"bert"``.

    Returns:
        the key, or ``None`` for a model of none of these kinds.
    """
    if getattr(model, "model_type", None) == "decoder":  # attnlab's DecoderForCausalLM
        kept = (getattr(model, "checkpoint_config", None) or {}).get("model_type")
        if kept:
            return str(kept)
        return "gpt2" if getattr(model.config, "position", None) == "learned" else "llama"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if isinstance(model_type, str) and model_type:
        return model_type
    return "bert" if hasattr(model, "encoder") else None
