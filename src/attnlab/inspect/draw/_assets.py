"""The pages' stylesheets and scripts, shipped as package data in ``assets/``.

``report.css`` / ``report.js`` serve ``report.html`` and the summary page,
``generation.css`` / ``generation.js`` add to them for ``generation.html``,
``generation_explanation.*`` for its page, and ``explanation.css`` / ``explanation.js``
style and build the explanation fragment (notebooks and ``explanation.html``), and
``method_box.js`` builds a method's box (name, faithfulness) for both explanation pages. They are
inlined into every page, so a page opens without the network. The scripts read their data
from ``<script id="attnlab-data" type="application/json">`` and write token text only
through ``textContent``, never as HTML.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

__all__ = ["asset"]


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (``"report.css"``, ``"report.js"``, ``"generation.css"``,
    ``"generation.js"``, ``"generation_explanation.css"``, ``"generation_explanation.js"``,
    ``"explanation.css"``, ``"explanation.js"``, ``"method_box.js"``)."""
    return files(__package__).joinpath("assets", name).read_text(encoding="utf-8")
