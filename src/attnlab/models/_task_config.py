"""``from_config`` of the encoder's task models (:class:`~attnlab.models.classifier.EncoderClassifier`,
:class:`~attnlab.models.masked_lm.EncoderForMaskedLM`): an encoder and a head's keywords."""

from __future__ import annotations

from typing import Any, Optional, TypeVar

from .encoder import TransformerEncoder

__all__ = ["EncoderTaskConfig"]

Model = TypeVar("Model")


class EncoderTaskConfig:
    """Mixin: ``from_config`` of a model built as ``cls(encoder, **head, device=, dtype=)``."""

    model_type: str

    @classmethod
    def from_config(
        cls: type[Model], config: dict[str, Any], *, encoder: Optional[TransformerEncoder] = None,
        device=None, dtype=None,
    ) -> Model:
        """A fresh model from its ``config.json`` dict (``{"model_type", "encoder", "head"}``,
        what :func:`attnlab.checkpoints.model_config` writes).

        Args:
            config: the dict; its ``"encoder"`` entry builds the encoder, its ``"head"``
                entry holds the constructor's keywords.
            encoder: an encoder built already (a pretrained family's), instead of the
                config's ``"encoder"`` entry.
        """
        if not isinstance(config, dict):
            raise TypeError(f"{cls.__name__}.from_config takes a config.json dict, got {type(config).__name__}")
        model_type = config.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"config's model_type is {model_type!r}; {cls.__name__}.from_config builds "
                             f"{cls.model_type!r}")
        if encoder is None:
            encoder = TransformerEncoder.from_config(config, device=device, dtype=dtype)
        return cls(encoder, **config.get("head", {}), device=device, dtype=dtype)
