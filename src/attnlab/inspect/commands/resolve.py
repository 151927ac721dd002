"""Find the model and tokenizer that ``--model`` names: a run, a checkpoint, a pretrained dir or name.

Everything goes through :func:`attnlab.load` (one loader, one set of rules): an attnlab
run or checkpoint directory, a HuggingFace directory, a ``.gguf`` file, or a packaged name
such as ``minilm`` or ``smollm2``; every command that takes ``--model`` takes what
``attnlab.load`` takes. A HuggingFace directory of an architecture attnlab does not
re-implement (Gemma 3, Qwen3, T5, ...) opens through ``transformers`` under attnlab's
attention function (:mod:`attnlab.hf`). The loaders are imported only when used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

__all__ = ["MODEL_HELP", "ResolvedModel", "max_length_for", "resolve_model"]

MODEL_HELP = ("what attnlab.load opens: a run or checkpoint directory, a HuggingFace directory, "
              "a .gguf file, or a packaged name (minilm, smollm2)")


@dataclass
class ResolvedModel:
    """A model ready to inspect.

    Attributes:
        model: the ``nn.Module`` (called as ``model(input_ids, mask=...)``).
        tokenizer: an :class:`attnlab.data.Tokenizer` (wraps a ``tokenizers.Tokenizer``).
        name: what ``--model`` said.
        source: ``"run"``, ``"checkpoint"``, ``"pretrained"`` or ``"transformers"``.
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
        raise FileNotFoundError(f"--model {spec!r}: no such file or directory")
    from ...hf.opening import is_transformers_only

    if path.is_dir() and is_transformers_only(path):
        return _resolve_transformers(spec)
    from ...models.loading import detect_format, load

    kind = detect_format(spec)
    loaded = load(spec)
    if loaded.tokenizer is None:
        raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one")
    source = {"attnlab-run": "run", "attnlab-checkpoint": "checkpoint"}.get(kind, "pretrained")
    return ResolvedModel(loaded.model, loaded.tokenizer, spec, source)


def _resolve_transformers(spec: str) -> ResolvedModel:
    from ...hf.opening import open_transformers
    from ...models.pretrained import load_tokenizer

    try:
        tokenizer = load_tokenizer(spec)
    except FileNotFoundError:
        raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one") from None
    model = open_transformers(spec)
    limit = getattr(model.config, "max_position_embeddings", None)
    tokenizer.model_max_length = limit if isinstance(limit, int) and limit > 0 else None
    print(f"{spec}: {type(model.model).__name__} through transformers, attention served by attnlab "
          f"(exact weights where asked, fused sdpa elsewhere)")
    return ResolvedModel(model, tokenizer, spec, "transformers")


def max_length_for(resolved: ResolvedModel, requested: Optional[int], *, fallback: int) -> int:
    """The token budget a command uses: ``--max-length`` if given (refused past the model's
    limit), else the model's own limit, else ``fallback`` (models without one, e.g. rotary).

    Raises:
        ValueError: ``requested`` is below 2 or above what the model takes.
    """
    limit = getattr(resolved.tokenizer, "model_max_length", None)
    if requested is None:
        return limit if limit is not None else fallback
    if requested < 2:
        raise ValueError(f"--max-length must be at least 2 (room for [CLS] and [SEP]), got {requested}")
    if limit is not None and requested > limit:
        raise ValueError(
            f"--max-length {requested} is more than {resolved.name} takes ({limit} positions); "
            f"pass --max-length {limit} or less, or leave it out"
        )
    return requested
