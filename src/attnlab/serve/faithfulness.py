"""The explanation methods' faithfulness as the project measured it (``benchmarks/faithfulness.py``).

Deletion AOPC (the mean drop of the explained quantity as the top-ranked tokens are deleted;
higher is more faithful), with the random ranking's figure beside it, copied from the tables in
``docs/design.md``. They were measured on one model of each kind, not on the model being
served: the page says on which, and shows nothing for a method never measured.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["MEASURED", "faithfulness_of"]

MEASURED: dict[str, dict] = {
    "classifier": {
        "measured_on": "MiniLM fine-tuned on rotten tomatoes (100 test texts)",
        "quantity": "probability of the predicted class",
        "aopc": {"integrated-gradients": 0.584, "grad-attention": 0.415, "relevance": 0.350, "raw": 0.324,
                 "rollout": 0.311, "flow": 0.273},
        "random": 0.182,
    },
    "decoder": {
        "measured_on": "SmolLM2-135M-Instruct (12 prompts of 16 tokens)",
        "quantity": "log p(next token), in nats",
        "aopc": {"raw": 7.336, "grad-attention": 7.177, "occlusion": 5.366, "integrated-gradients": 3.757,
                 "rollout": 1.865},
        "random": 3.933,
    },
}


def faithfulness_of(kind: str) -> Optional[dict]:
    """The measured figures for a model of ``kind`` (``"classifier"``, ``"decoder"``); ``None``
    for kinds with nothing measured (a bare encoder explains no prediction)."""
    return MEASURED.get(kind)
