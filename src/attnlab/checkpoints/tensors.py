"""A checkpoint's safetensors, one file or sharded, read one tensor at a time; the load dtype.

A HuggingFace directory holds its weights in ``model.safetensors``, or, from a few GB on,
in shards named by ``model.safetensors.index.json`` (``transformers``'
``save_pretrained(max_shard_size=...)``). :class:`CheckpointTensors` is a read-only
mapping over either: names, shapes and dtypes come from the files' headers, and a tensor
is read (memory-mapped, through ``safetensors.safe_open``) only when it is looked up,
converted to the load dtype and device at once, and its file unmapped again. A loader
that builds its model on the ``meta`` device and assigns the converted tensors therefore
holds, at its peak, the model in the chosen dtype plus one tensor in flight: never the
whole checkpoint next to a converted copy.

:func:`resolve_dtype` reads the ``dtype`` that :func:`attnlab.load` and ``--dtype`` take:
``"float32"`` (the default), ``"bfloat16"``, ``"float16"`` or ``"auto"``, the
checkpoint's own (:meth:`CheckpointTensors.stored_dtype`, else the ``config.json``'s
``dtype`` / ``torch_dtype``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .._files import CorruptFileError, read_json
from .errors import UnsupportedCheckpointError

__all__ = ["DTYPES", "DTYPE_CHOICES", "INDEX_FILE", "META_BUILD_VALUES", "WEIGHTS_FILE", "CheckpointTensors",
           "DtypeLike", "building", "config_dtype", "dtype_name", "has_safetensors", "parameters_on_meta",
           "resolve_dtype"]

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_CHOICES = ("float32", "bfloat16", "float16", "auto")
# the dtype names of the safetensors format that a model may be loaded in
_STORED = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")

PathLike = Union[str, Path]
DtypeLike = Union[None, str, torch.dtype]


def resolve_dtype(dtype: DtypeLike, *, argument: str = "dtype") -> Union[torch.dtype, str]:
    """The load dtype ``dtype`` names: a ``torch.dtype`` of :data:`DTYPES`, or ``"auto"``.

    ``None`` is torch's default dtype (float32 unless changed). ``argument`` names the
    argument in the error (``"--dtype"`` on the command line).

    Raises:
        ValueError: anything else; the message lists the choices.
    """
    if dtype is None:
        return torch.get_default_dtype()
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("torch.")
        if name == "auto":
            return "auto"
        if name in DTYPES:
            return DTYPES[name]
    raise ValueError(f"{argument} must be one of {', '.join(DTYPE_CHOICES)} (or torch.float32, "
                     f"torch.bfloat16, torch.float16), got {dtype!r}")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def config_dtype(values: Any) -> Optional[torch.dtype]:
    """The dtype a HuggingFace ``config.json`` states (``dtype``, or ``torch_dtype`` before
    transformers v5), when it is one attnlab loads in; else ``None``."""
    if not isinstance(values, dict):
        return None
    stated = values.get("dtype", values.get("torch_dtype"))
    return DTYPES.get(stated.removeprefix("torch.")) if isinstance(stated, str) else None


def has_safetensors(directory: PathLike) -> bool:
    """Whether ``directory`` holds ``model.safetensors`` or a sharded checkpoint's index."""
    directory = Path(directory)
    return (directory / WEIGHTS_FILE).is_file() or (directory / INDEX_FILE).is_file()


def _safetensors_error():
    from safetensors import SafetensorError

    return SafetensorError


def _message(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


class CheckpointTensors(Mapping):
    """The tensors of ``model.safetensors`` or of a sharded checkpoint, read when looked up.

    Looking a name up reads that tensor alone (the file is memory-mapped while it is read,
    and unmapped afterwards), converts it to ``dtype`` (floating-point tensors only) and
    puts it on ``device``. :meth:`shape` and :meth:`stored_dtype` read only headers.

    Args:
        files: tensor name -> the file that holds it.
        headers: tensor name -> ``(shape, safetensors dtype name)``.
        dtype: the floating-point dtype tensors come back in (``None``: as stored).
        device: where tensors come back (``None``: CPU).

    Example:
        >>> tensors = CheckpointTensors.open("checkpoints/llama", dtype=torch.bfloat16)
        >>> tensors.shape("model.embed_tokens.weight"), tensors["model.norm.weight"].dtype
    """

    def __init__(
        self,
        files: dict[str, Path],
        headers: dict[str, tuple[tuple[int, ...], str]],
        *,
        dtype: Optional[torch.dtype] = None,
        device: Optional[Union[str, torch.device]] = None,
    ) -> None:
        self.files = files
        self.headers = headers
        self.dtype = dtype
        self.device = device

    @classmethod
    def open(cls, directory: PathLike, *, dtype: Optional[torch.dtype] = None,
             device: Optional[Union[str, torch.device]] = None) -> "CheckpointTensors":
        """The safetensors of a checkpoint directory: ``model.safetensors``, else the shards
        that ``model.safetensors.index.json`` names. Only headers are read here.

        Raises:
            FileNotFoundError: neither file is there, or a shard the index names is missing.
            UnsupportedCheckpointError: the directory holds pickled weights only (they are
                never unpickled; the message says how to convert them).
            CorruptFileError: a damaged header or index, or an index that names a tensor
                its shard does not hold.
        """
        directory = Path(directory)
        single = directory / WEIGHTS_FILE
        if single.is_file():
            files = {name: single for name in _read_header(single)}
            return cls(files, _read_headers(files), dtype=dtype, device=device)
        index = directory / INDEX_FILE
        if index.is_file():
            files = _shard_files(index)
            return cls(files, _read_headers(files), dtype=dtype, device=device)
        pickled = [name for name in _PICKLED if (directory / name).is_file()]
        if pickled:
            raise UnsupportedCheckpointError(
                f"{directory} has {pickled} but no {WEIGHTS_FILE}; attnlab reads safetensors only and "
                f"never unpickles weights. Convert the checkpoint once, e.g. with transformers: "
                f"AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
            )
        raise FileNotFoundError(f"{directory} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")

    def converted(
        self, dtype: Optional[torch.dtype], device: Optional[Union[str, torch.device]] = None
    ) -> "CheckpointTensors":
        """The same tensors, coming back in ``dtype`` on ``device``."""
        return CheckpointTensors(self.files, self.headers, dtype=dtype, device=device)

    def shape(self, name: str) -> tuple[int, ...]:
        """The stored shape of ``name``, from its file's header."""
        return self.headers[name][0]

    def stored_dtype(self) -> Optional[torch.dtype]:
        """The dtype most of the checkpoint's floating-point values are stored in (counted in
        values, so a few float32 norms next to bfloat16 matrices say bfloat16); ``None`` when
        none is float32, bfloat16 or float16."""
        counts: Counter = Counter()
        for shape, stored in self.headers.values():
            if stored in _STORED:
                counts[_STORED[stored]] += _numel(shape)
        return counts.most_common(1)[0][0] if counts else None

    def numel(self) -> int:
        """How many values the checkpoint holds, from its headers."""
        return sum(_numel(shape) for shape, _ in self.headers.values())

    def __getitem__(self, name: str) -> Tensor:
        from safetensors import safe_open

        path = self.files[name]
        try:
            with safe_open(str(path), framework="pt") as handle:  # mapped for this one tensor
                tensor = handle.get_tensor(name)
        except _safetensors_error() as error:
            raise CorruptFileError(path, f"damaged safetensors file ({_message(error)})") from None
        if self.dtype is not None and tensor.is_floating_point() and tensor.dtype != self.dtype:
            tensor = tensor.to(self.dtype)
        return tensor if self.device is None else tensor.to(self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _read_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Tensor name -> ``(shape, dtype name)`` of one safetensors file (its header only)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: (tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                    for name in handle.keys()}
    except _safetensors_error() as error:
        raise CorruptFileError(path, f"damaged safetensors file ({_message(error)})") from None


def _read_headers(files: dict[str, Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    headers: dict[str, tuple[tuple[int, ...], str]] = {}
    for path in dict.fromkeys(files.values()):
        found = _read_header(path)
        wanted = [name for name, where in files.items() if where == path]
        absent = [name for name in wanted if name not in found]
        if absent:
            raise CorruptFileError(path, f"lacks {len(absent)} tensor(s) its index names, e.g. {absent[0]}")
        headers.update({name: found[name] for name in wanted})
    return headers


def _shard_files(index: Path) -> dict[str, Path]:
    """Tensor name -> shard path, from a ``model.safetensors.index.json``."""
    content = read_json(index)
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CorruptFileError(index, "has no 'weight_map' object naming each tensor's shard")
    files: dict[str, Path] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise CorruptFileError(
                index, f"names {shard!r} for {name}; shards are file names in its directory")
        files[name] = index.parent / shard
    missing = sorted({path.name for path in files.values() if not path.is_file()})
    if missing:
        raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
    return files


# Parameters on the meta device spare a model its random initialisation (about 14 ns a value
# on two cores: 4.7 s for BERT-large), but the first normal_ on a meta tensor imports
# torch._dynamo (about 1.1 s, once per process). From this many values on, meta is quicker.
META_BUILD_VALUES = 50_000_000


def building(values: int) -> AbstractContextManager:
    """The context to build a model of ``values`` parameter values in, before the
    checkpoint's tensors are assigned to it: :func:`parameters_on_meta` from
    :data:`META_BUILD_VALUES` on, else nothing (the small model is initialised as usual,
    and its initial values are replaced)."""
    return parameters_on_meta() if values >= META_BUILD_VALUES else nullcontext()


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every ``nn.Parameter`` registered on a module is moved to the ``meta`` device.

    A model built inside has no storage for (and spends no time initialising) its
    parameters, while its buffers (rotary frequencies, sinusoidal tables: not in the
    checkpoint, computed at construction) are built for real; the loader then assigns
    the checkpoint's tensors (``load_state_dict(..., assign=True)``). torch's registration
    hook is process-wide, so it is removed on the way out, whatever happens.
    """

    def to_meta(module: nn.Module, name: str, parameter: Optional[nn.Parameter]
                ) -> Optional[nn.Parameter]:
        if parameter is None or parameter.is_meta:
            return None
        return nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)

    handle = nn.modules.module.register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()
