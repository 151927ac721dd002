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


SAVED_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")


def check_save_directory(directory: Any, *, overwrite: bool) -> None:
    """Refuse, before writing, a ``directory`` that is not a path, is a file, or already
    holds a model's files (unless ``overwrite``)."""
    if not isinstance(directory, (str, Path)) or (isinstance(directory, str) and not directory.strip()):
        raise TypeError(f"directory must be a path (str or pathlib.Path), got {directory!r}")
    directory = Path(directory)
    if directory.is_file():
        raise ValueError(f"directory {directory} is a file; name a directory to save into")
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite must be True or False, got {overwrite!r}")
    if overwrite or not directory.is_dir():
        return
    present = [name for name in SAVED_FILES if (directory / name).exists()]
    if present:
        raise ValueError(f"{directory / present[0]} already exists; pass overwrite=True to replace it, or save "
                         f"into another directory")


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
        self, directory: Union[str, Path], *, tokenizer: Any = None, layout: str = "attnlab",
        overwrite: bool = False,
    ) -> Path:
        """Write the model so that ``Class.from_pretrained(directory)`` opens it again;
        ``layout="huggingface"`` writes its family's HuggingFace layout instead (an encoder's,
        BERT's for attnlab's own dense encoders, a decoder's GPT-2 / Llama / Mistral / Qwen2),
        which ``transformers`` opens.

        A directory that already holds a ``config.json`` or ``model.safetensors`` (another
        model's, or the one this model came from) is refused, naming the file, unless
        ``overwrite=True``, which replaces files of the same names.
        """
        check_save_directory(directory, overwrite=overwrite)
        return _loader().save(self, directory, tokenizer=tokenizer, layout=layout)
