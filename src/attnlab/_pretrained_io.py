"""``Class.from_pretrained(path)`` and ``model.save_pretrained(dir)`` for attnlab's models.

The loader lives in :mod:`attnlab.models.loading`, above the layers that
:class:`~attnlab.TransformerEncoder` belongs to, so the classes reach it by its module
name (as the command line reaches its subcommands) instead of importing up the tree.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, TypeVar, Union

__all__ = ["PretrainedIO"]

LOADER_MODULE = "attnlab.models.loading"
Model = TypeVar("Model", bound="PretrainedIO")


def _loader():
    return importlib.import_module(LOADER_MODULE)


class PretrainedIO:
    """Mixin: open and save a model the way HuggingFace users do."""

    @classmethod
    def from_pretrained(
        cls: type[Model], path_or_name: Union[str, Path], *, device=None, dtype=None
    ) -> Model:
        """Open an attnlab run or checkpoint directory, a HuggingFace directory or a
        packaged name (``"minilm"``) as this class, in eval mode, in ``dtype`` (float32 by
        default; ``"bfloat16"``, ``"float16"``, ``"auto"``: see :func:`attnlab.load`)."""
        return _loader().load_as(cls, path_or_name, device=device, dtype=dtype)

    def save_pretrained(
        self, directory: Union[str, Path], *, tokenizer: Any = None, layout: str = "attnlab"
    ) -> Path:
        """Write the model so that ``Class.from_pretrained(directory)`` opens it again;
        ``layout="huggingface"`` writes its family's HuggingFace layout instead (an encoder's,
        BERT's for attnlab's own dense encoders, a decoder's GPT-2 / Llama / Mistral / Qwen2),
        which ``transformers`` opens. Files of the same names in ``directory`` are replaced."""
        return _loader().save(self, directory, tokenizer=tokenizer, layout=layout)
