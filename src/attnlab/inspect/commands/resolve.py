"""Find the model and tokenizer that ``--model`` names: a run, a checkpoint, a pretrained dir or name.

* a run directory (``config.json`` + ``checkpoints/``) or a checkpoint directory
  (``model.safetensors`` + ``config.json`` with an ``"encoder"`` entry) is loaded with
  :func:`attnlab.models.load_model`, which also finds its ``tokenizer.json``;
* any other directory, or a name such as ``minilm``, goes to
  :func:`attnlab.models.pretrained.from_pretrained` and ``load_tokenizer``.

Those loaders are imported only when used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["ResolvedModel", "resolve_model"]


@dataclass
class ResolvedModel:
    """A model ready to inspect.

    Attributes:
        model: the ``nn.Module`` (called as ``model(input_ids, mask=...)``).
        tokenizer: a ``tokenizers.Tokenizer``.
        name: what ``--model`` said.
        source: ``"run"``, ``"checkpoint"`` or ``"pretrained"``.
    """

    model: nn.Module
    tokenizer: Any
    name: str
    source: str


def resolve_model(spec: str) -> ResolvedModel:
    """Load the model and tokenizer ``spec`` names (see the module docstring).

    Raises:
        FileNotFoundError: ``spec`` is a path that does not exist.
        ValueError: when nothing can be loaded from ``spec``; the message says why.
    """
    path = Path(spec)
    if not path.exists() and (os.sep in spec or spec.startswith(".")):
        raise FileNotFoundError(f"--model {spec!r}: no such directory")
    if path.is_file():
        raise ValueError(
            f"--model must be a run/checkpoint directory or a pretrained name, got the file {spec}"
        )
    if path.is_dir():
        from ...models.serialization import find_checkpoint_dir, load_model

        checkpoint = find_checkpoint_dir(path)
        if checkpoint is not None:
            loaded = load_model(checkpoint)
            if loaded.tokenizer is None:
                raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one")
            source = "checkpoint" if checkpoint == path else "run"
            return ResolvedModel(loaded.model, loaded.tokenizer, spec, source)
    from ...models.pretrained import from_pretrained, load_tokenizer

    return ResolvedModel(from_pretrained(spec).eval(), load_tokenizer(spec), spec, "pretrained")
