"""Find the model and tokenizer that ``--model`` names: a run, a checkpoint, a pretrained dir or name.

* a run directory (``config.json`` + ``checkpoints/``) or a checkpoint directory
  (``model.safetensors`` + ``config.json`` with an ``"encoder"`` entry) is loaded with
  :func:`attnlab.models.load_model`;
* any other directory, or a name such as ``minilm``, goes to
  :func:`attnlab.models.pretrained.from_pretrained` and ``load_tokenizer``.

Those loaders are imported only when used. Until ``attnlab.models`` is installed, a
checkpoint whose weights are a bare :class:`~attnlab.TransformerEncoder` still loads
(keys optionally prefixed with ``encoder.``), with ``tokenizer.json`` in the checkpoint,
run or a parent directory.
"""

from __future__ import annotations

import json
import logging
import os
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["ResolvedModel", "resolve_model", "special_token_groups", "find_tokenizer_pad_id"]


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


def _checkpoint_dir(path: Path) -> Optional[Path]:
    """The checkpoint inside a run directory (best, else last), or ``path`` itself."""
    if (path / "model.safetensors").is_file() and (path / "config.json").is_file():
        config = json.loads((path / "config.json").read_text())
        return path if isinstance(config, dict) and "encoder" in config else None
    for name in ("best", "last"):
        candidate = path / "checkpoints" / name
        if (candidate / "model.safetensors").is_file():
            return candidate
    return None


def _find_tokenizer_file(start: Path) -> Path:
    for directory in (start, *start.parents[:3]):
        if (directory / "tokenizer.json").is_file():
            return directory / "tokenizer.json"
    raise FileNotFoundError(f"no tokenizer.json in {start} or the three directories above it")


def _load_bare_encoder(checkpoint: Path) -> tuple[nn.Module, Any]:
    """Fallback loader for a checkpoint that holds a bare TransformerEncoder."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from ..layers import EncoderConfig, TransformerEncoder

    config = json.loads((checkpoint / "config.json").read_text())
    model = TransformerEncoder.from_config(EncoderConfig.from_dict(config["encoder"]))
    state = load_file(str(checkpoint / "model.safetensors"))
    state = {key.removeprefix("encoder."): value for key, value in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing:
        raise ValueError(
            f"{checkpoint} does not hold a bare TransformerEncoder (missing {missing[:3]}...); "
            f"loading task models needs attnlab.models.load_model"
        )
    if unexpected:
        logger.info("ignoring %d weights outside the encoder (e.g. %s)", len(unexpected), unexpected[0])
    return model.eval(), Tokenizer.from_file(str(_find_tokenizer_file(checkpoint)))


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
        checkpoint = _checkpoint_dir(path)
        if checkpoint is not None:
            source = "checkpoint" if checkpoint == path else "run"
            try:
                from ..models import load_model  # type: ignore[attr-defined]
            except ImportError:
                model, tokenizer = _load_bare_encoder(checkpoint)
                return ResolvedModel(model, tokenizer, spec, source)
            loaded = load_model(path)
            if loaded.tokenizer is None:
                raise ValueError(f"{spec} holds a model but no tokenizer.json; inspecting text needs one")
            return ResolvedModel(loaded.model, loaded.tokenizer, spec, source)
    try:
        from ..models.pretrained import from_pretrained, load_tokenizer  # type: ignore[import-not-found]
    except ImportError as error:
        raise ValueError(
            f"--model {spec!r} is neither a run nor a checkpoint directory, and pretrained models "
            f"are not available in this installation ({error})"
        ) from error
    return ResolvedModel(from_pretrained(spec).eval(), load_tokenizer(spec), spec, "pretrained")


_CLS = ("[CLS]", "<s>", "[BOS]", "<bos>")
_SEP = ("[SEP]", "</s>", "[EOS]", "<eos>")
_PAD = ("[PAD]", "<pad>")


def find_tokenizer_pad_id(tokenizer: Any) -> Optional[int]:
    """The id of the tokenizer's padding token, if it has one of the usual names."""
    for token in _PAD:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


def _is_punctuation(token: str) -> bool:
    text = token.removeprefix("##").lstrip("\u0120\u2581")  # WordPiece / byte-BPE / SentencePiece marks
    return bool(text) and all(unicodedata.category(char).startswith("P") for char in text)


def special_token_groups(tokenizer: Any) -> dict[str, list[int]]:
    """``{"cls": ids, "sep": ids, "punct": ids}`` found in the tokenizer's vocabulary."""
    vocabulary = tokenizer.get_vocab()
    groups = {
        "cls": [vocabulary[token] for token in _CLS if token in vocabulary],
        "sep": [vocabulary[token] for token in _SEP if token in vocabulary],
        "punct": sorted(token_id for token, token_id in vocabulary.items() if _is_punctuation(token)),
    }
    return {name: ids for name, ids in groups.items() if ids}
