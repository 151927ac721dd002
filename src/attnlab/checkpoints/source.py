"""What a path or name holds, found once: :func:`open_source`.

Every door that opens a model (``attnlab.load`` and its aliases) starts here. A
directory's ``config.json`` is read once, and every decision that hangs on it is made
here, once: the format (:data:`FORMATS`), encoder or decoder, and an encoder's family.
The format's reader (:func:`~attnlab.checkpoints.attnlab_layout.read_checkpoint`,
:func:`~attnlab.checkpoints.encoders.loading.read_encoder`,
:func:`~attnlab.checkpoints.decoders.loading.read_decoder`) gets what was read here and
reads no ``config.json`` again.

:func:`read_config` is the one function in attnlab that reads a model's ``config.json``;
the other looks that need one (:func:`find_checkpoint_dir`, :func:`pretrained_width`, a
training run's check of ``model.pretrained``) call it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from .._files import CorruptFileError, check_path_argument, read_json
from .attnlab_layout import CONFIG_FILE, MODEL_FILE, is_attnlab_config, is_decoder_config, run_checkpoint
from .decoders.loading import DECODER_MODEL_TYPES, PACKAGED_GGUF_NAMES, packaged_gguf
from .encoders import FAMILIES, Family
from .encoders.loading import PRETRAINED_NAMES, packaged_name, pretrained_dir

__all__ = ["FORMATS", "Source", "find_checkpoint_dir", "open_source", "pretrained_width", "read_config"]

FORMATS = ("attnlab-run", "attnlab-checkpoint", "huggingface")  # a GGUF file counts as "huggingface"
PathLike = Union[str, Path]


@dataclass(frozen=True)
class Source:
    """A model on disk, looked at once.

    Attributes:
        name: what was asked for, as given (for messages).
        format: one of :data:`FORMATS`.
        is_decoder: a decoder-only language model (else an encoder, with or without a head).
        directory: the directory the model's files are in (a run's best, else last,
            checkpoint; a packaged name's folder); ``None`` for a GGUF file.
        config: that directory's ``config.json``, parsed once; ``None`` for a GGUF file.
        gguf: the GGUF file, for one.
        family: a HuggingFace encoder's family; ``None`` for any other source, and for a
            ``model_type`` attnlab does not re-implement (its reader says which it does).
    """

    name: str
    format: str
    is_decoder: bool
    directory: Optional[Path] = None
    config: Optional[dict[str, Any]] = None
    gguf: Optional[Path] = None
    family: Optional[Family] = None

    @property
    def is_attnlab(self) -> bool:
        """attnlab's own layout (a run or checkpoint directory)."""
        return self.format in ("attnlab-run", "attnlab-checkpoint")

    @property
    def where(self) -> str:
        """The directory or file, for messages."""
        return str(self.gguf if self.gguf is not None else self.directory)


def open_source(path_or_name: Union[PathLike, Source]) -> Source:
    """Find what ``path_or_name`` holds, reading its ``config.json`` (if any) once.

    Args:
        path_or_name: an attnlab run or checkpoint directory, a HuggingFace directory
            (encoder or decoder, ``model.safetensors`` or shards), a ``.gguf`` file (or a
            directory with just one), or a packaged name (``"minilm"``, ``"smollm2"``).
            A :class:`Source` is handed back as it is.

    Raises:
        FileNotFoundError: no such path (and not a packaged name), a file that is not
            ``.gguf``, or a directory that holds no model attnlab knows; the message says
            what was found. Also when a packaged name's package is not installed (the
            message names the pip command).
        CorruptFileError: ``config.json`` is not a JSON object.
        TypeError: ``path_or_name`` is not a str or Path.
    """
    if isinstance(path_or_name, Source):
        return path_or_name
    check_path_argument("path_or_name", path_or_name)  # None, a number, "": one line, not pathlib's
    name = str(path_or_name)
    if isinstance(path_or_name, str) and name.lower() in PACKAGED_GGUF_NAMES:
        return Source(name, "huggingface", True, gguf=packaged_gguf(name.lower()))
    if isinstance(path_or_name, str) and packaged_name(name) is not None:
        return _directory(name, pretrained_dir(name))
    path = Path(path_or_name)
    if not path.exists():
        names = ", ".join([*PRETRAINED_NAMES, *PACKAGED_GGUF_NAMES])
        raise FileNotFoundError(
            f"no model at {name!r}: the path does not exist and it is neither a directory nor a known "
            f"pretrained name (known: {names}); nothing is downloaded"
        )
    if path.is_file():
        if path.suffix == ".gguf":
            return Source(name, "huggingface", True, gguf=path)
        raise FileNotFoundError(
            f"{path} is a file; pass a .gguf file or the directory that holds {MODEL_FILE} and {CONFIG_FILE}"
        )
    return _directory(name, path)


def _directory(name: str, path: Path) -> Source:
    has_config, has_weights = (path / CONFIG_FILE).is_file(), (path / MODEL_FILE).is_file()
    if not (has_config and has_weights):
        run = run_checkpoint(path)  # checkpoints/best (else last): the run's own config.json is not a model's
        if run is not None:
            config = read_config(run)
            return Source(name, "attnlab-run", is_decoder_config(config), run, config)
    if not has_config:
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return Source(name, "huggingface", True, gguf=ggufs[0])
        if has_weights:
            raise FileNotFoundError(f"{path} has {MODEL_FILE} but no {CONFIG_FILE}")
        raise _no_model(path)
    config = read_config(path)
    model_type = config.get("model_type")
    if model_type in DECODER_MODEL_TYPES and "encoder" not in config:
        return Source(name, "huggingface", True, path, config)
    if is_attnlab_config(config):
        if not has_weights:
            raise FileNotFoundError(f"{path} has the {CONFIG_FILE} of an attnlab checkpoint but no {MODEL_FILE}")
        return Source(name, "attnlab-checkpoint", is_decoder_config(config), path, config)
    if model_type is not None:
        return Source(name, "huggingface", False, path, config, family=FAMILIES.get(model_type))
    raise _no_model(path)


def read_config(directory: Path) -> dict[str, Any]:
    """``directory``'s ``config.json``, parsed: the one reader of a model's config file.

    Raises:
        FileNotFoundError: there is none.
        CorruptFileError: it is not JSON, or not a JSON object.
    """
    if not (directory / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{directory} has {MODEL_FILE} but no {CONFIG_FILE}")
    config = read_json(directory / CONFIG_FILE)
    if not isinstance(config, dict):
        raise CorruptFileError(directory / CONFIG_FILE, f"holds a JSON {type(config).__name__}, not an object")
    return config


def find_checkpoint_dir(path: Union[str, Path]) -> Optional[Path]:
    """The attnlab checkpoint ``path`` holds (itself, or a run's best else last checkpoint),
    or ``None`` when it holds none: a pretrained directory, say, whose ``config.json``
    has no ``"encoder"`` or ``"decoder"`` entry."""
    path = Path(path)
    if (path / MODEL_FILE).is_file() and (path / CONFIG_FILE).is_file():
        return path if is_attnlab_config(read_config(path)) else None
    return run_checkpoint(path)


def pretrained_width(name_or_path: PathLike) -> Optional[int]:
    """The model width ``E`` a checkpoint's ``config.json`` states (HuggingFace's
    ``hidden_size`` or DistilBERT's ``dim``, attnlab's ``d_model``), without loading it;
    ``None`` when there is no such file or key (the loader reports what is wrong later)."""
    try:
        values = read_config(pretrained_dir(name_or_path))
    except (OSError, ValueError, TypeError):
        return None
    for scope in (values, values.get("encoder")):
        if isinstance(scope, dict):
            for key in ("hidden_size", "dim", "d_model"):
                if isinstance(scope.get(key), int) and not isinstance(scope.get(key), bool):
                    return scope[key]
    return None


def _no_model(path: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"{path} holds no model attnlab knows: neither a checkpoint directory ({MODEL_FILE} + {CONFIG_FILE} "
        f"with an 'encoder' or 'decoder' entry), an attnlab run (checkpoints/best or last) nor a "
        f"HuggingFace directory ({CONFIG_FILE} with a 'model_type', or one .gguf file)"
    )
