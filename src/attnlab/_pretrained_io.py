"""``Class.from_pretrained(path)`` and ``model.save_pretrained(dir)`` for attnlab's models.

The loader (:mod:`attnlab.checkpoints`) sits above the models it builds, so the model
classes cannot import it. It hands itself to this module when it is imported
(:func:`register_loader`, called by :mod:`attnlab.checkpoints.loading`; ``import attnlab``
imports it), and the classes call what was handed. No import goes up the tree.
The format modules below the loader keep their old public names of the loader's doors
(``from_pretrained``, ``load_model``, ``load_decoder``) the same way: :func:`loader_aliases`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, TypeVar, Union

__all__ = ["PretrainedIO", "check_save_directory", "loader", "loader_aliases", "register_loader"]

Model = TypeVar("Model", bound="PretrainedIO")
_LOADER: Optional[Any] = None


def register_loader(module: Any) -> None:
    """Hand the loader (a module with ``load_as``, ``save``, ``from_pretrained``,
    ``load_tokenizer`` and ``pretrained_dir``) to the model classes."""
    global _LOADER
    _LOADER = module


def loader() -> Any:
    """The loader :func:`register_loader` was given."""
    if _LOADER is None:  # only when attnlab.checkpoints was never imported, which `import attnlab` does
        raise RuntimeError("attnlab's loader is not registered: import attnlab (or attnlab.checkpoints) first")
    return _LOADER


def loader_aliases(module: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that hands out the loader's functions ``names`` (the objects
    themselves), so ``from module import name`` keeps working for a door that moved up into
    the loader without the module importing it."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(loader(), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


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


class PretrainedIO:
    """Mixin: open and save a model the way HuggingFace users do."""

    @classmethod
    def from_pretrained(
        cls: type[Model], path_or_name: Union[str, Path], *, device=None, dtype=None
    ) -> Model:
        """Open an attnlab run or checkpoint directory, a HuggingFace directory or a
        packaged name (``"minilm"``) as this class, in eval mode, in ``dtype`` (float32 by
        default; ``"bfloat16"``, ``"float16"``, ``"auto"``: see :func:`attnlab.load`)."""
        return loader().load_as(cls, path_or_name, device=device, dtype=dtype)

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
        return loader().save(self, directory, tokenizer=tokenizer, layout=layout)
