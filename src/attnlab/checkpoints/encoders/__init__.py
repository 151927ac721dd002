"""HuggingFace encoder families: each a conversion table plus a block spec.

:data:`FAMILIES` maps ``config.json``'s ``model_type`` to its :class:`Family`. Adding a
family is one table file here and one line below; a mechanism no component covers yet
(a norm, a position scheme, a score bias) is one new component in ``layers/`` or
``attention/`` with its own tests.
"""

from __future__ import annotations

from typing import Any

from ...layers import EncoderConfig
from ...models.encoder import TransformerEncoder
from .._table import ClassifierTable, Family
from ..errors import UnsupportedCheckpointError
from .albert import ALBERT
from .bert import BERT
from .deberta_v2 import DEBERTA_V2
from .distilbert import DISTILBERT
from .electra import ELECTRA
from .modernbert import MODERNBERT
from .mpnet import MPNET
from .roberta import ROBERTA, XLM_ROBERTA

__all__ = [
    "FAMILIES",
    "ClassifierTable",
    "Family",
    "UnsupportedCheckpointError",
    "build_from_checkpoint_config",
    "family_for",
]

FAMILIES: dict[str, Family] = {
    model_type: family
    for family in (BERT, ROBERTA, XLM_ROBERTA, DISTILBERT, ELECTRA, ALBERT, MPNET, MODERNBERT, DEBERTA_V2)
    for model_type in family.model_types
}


def family_for(values: dict[str, Any], *, source: str = "config.json") -> Family:
    """The family of a ``config.json`` dict, from its ``model_type``.

    Raises:
        UnsupportedCheckpointError: the model type is not supported; the message lists
            those that are.
    """
    model_type = values.get("model_type")
    if model_type not in FAMILIES:
        raise UnsupportedCheckpointError(
            f"{source}: model_type is {model_type!r} (architectures {values.get('architectures')}); "
            f"supported: {', '.join(sorted(FAMILIES))}"
        )
    return FAMILIES[model_type]


def build_from_checkpoint_config(
    values: dict[str, Any], config: EncoderConfig, *, device=None, dtype=None
) -> TransformerEncoder:
    """The encoder of a family checkpoint, rebuilt from its ``config.json`` dict and an
    :class:`~attnlab.EncoderConfig` (which may carry changed dropouts), freshly initialised.

    attnlab's own checkpoints of a fine-tuned family encoder keep both, so they reopen
    with the family's components (see :mod:`attnlab.checkpoints.attnlab_layout`).
    """
    family = family_for(values)
    encoder = family.build(values, config, device=device, dtype=dtype)
    family.after_load(encoder, values)
    encoder.checkpoint_config = values
    return encoder
