"""The explanation methods' faithfulness as the project measured it, for the explorer page.

A thin use of :mod:`attnlab.inspect.faithfulness` (the figures ``benchmarks/faithfulness.py``
recorded in the package): the served model's family's figures, else another family's of the
same kind, marked so: the page says on which model they were measured, and shows nothing for a
method never measured.
"""

from __future__ import annotations

from typing import Any, Optional

from ..inspect.faithfulness import faithfulness_for

__all__ = ["faithfulness_of"]


def faithfulness_of(kind: str, family: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The measured figures for a model of ``kind`` (``"classifier"``, ``"decoder"``) and ``family``.

    Args:
        kind: the served model's kind; a bare encoder explains no prediction and gets ``None``.
        family: its family key (:func:`~attnlab.inspect.faithfulness.model_family`).

    Returns:
        ``None`` when nothing of ``kind`` was measured; else the entry
        (:meth:`~attnlab.inspect.faithfulness.FamilyFaithfulness.to_json`) with, for the page:
        ``measured_on`` (model and texts), ``aopc`` (each method's mean on the primary measure),
        ``random`` (the random ranking's), ``interval`` (each method's ``[low, high]`` on it) and
        ``at_or_below_random`` (methods whose interval does not clear random's on it).
    """
    measured = faithfulness_for(kind, family)
    if measured is None:
        return None
    primary = measured.figures.get(measured.primary, {})
    methods = [name for name in primary if name != "random"]
    return {**measured.to_json(),
            "measured_on": f"{measured.model} ({measured.texts} texts)",
            "aopc": {name: primary[name][0] for name in methods},
            "interval": {name: primary[name][1:] for name in methods},
            "random": primary["random"][0] if "random" in primary else None,
            "at_or_below_random": [name for name in methods
                                   if "random" in primary and measured.at_or_below_random(name)]}
