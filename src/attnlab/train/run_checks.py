"""Everything a run needs, checked before anything is written.

A start that fails on a typo (a device, a data file, a precision the device lacks) must
leave nothing behind that blocks the corrected command; so :func:`check_run` looks at the
config and the device first, and the run directory is written only after it passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from .._checks import check_memory
from ..data.text_files import read_labelled_texts
from ..data.tokenization import TOKENIZER_KINDS, load_tokenizer_file
from ..checkpoints.encoders import family_for
from ..checkpoints.encoders.loading import pretrained_dir
from ..checkpoints.source import read_config
from .run_config import RunConfig
from .tasks import DEFAULT_TASK, get_task

__all__ = ["check_device", "check_run"]


def check_device(device: Optional[str]) -> Optional[torch.device]:
    """``device`` as a ``torch.device`` this torch build can use (``None`` stays ``None``).

    Raises:
        ValueError: not a device name, or a device this machine or build does not have.
    """
    if device is None:
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"--device {device}: this torch build or machine has no usable GPU "
                f"(torch.cuda.is_available() is False); use --device cpu"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: there are {torch.cuda.device_count()} GPUs (cuda:0 ...)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {device}: attnlab runs on cpu, cuda or mps")
    return parsed


def check_run(config: RunConfig, device: Optional[str]) -> None:
    """Check the device, the precision on it, and the files the config names.

    Raises:
        ValueError, FileNotFoundError: one line naming the setting and what to do.
    """
    parsed = check_device(device)
    on_gpu = parsed is not None and parsed.type == "cuda"
    if config.train.precision == "fp16" and not on_gpu:
        raise ValueError(
            "train.precision='fp16' needs a GPU (--device cuda); use 'bf16' or 'fp32' on the CPU"
        )
    data = config.data
    if data.path is not None and data.task == DEFAULT_TASK:
        path = Path(data.path)
        if not path.is_file():
            problem = "is a directory; name a CSV or JSONL file" if path.is_dir() else "does not exist"
            raise FileNotFoundError(f"data file {path} {problem} (--data / data.path)")
        read_labelled_texts(path, text_column=data.text_column, label_column=data.label_column,
                            format=data.format)
    if data.tokenizer not in TOKENIZER_KINDS:
        load_tokenizer_file(data.tokenizer)
    pretrained = getattr(config.model, "pretrained", None)
    if pretrained:
        _check_pretrained(config, pretrained)
    else:
        _check_position_table(config)
    task = get_task(data.task)
    if task.check is not None:
        task.check(config)


# bytes per position and model dimension of a fresh encoder's position table: the sinusoidal
# table is built in float64 and kept in float32; learned positions are trained (weights,
# gradients and Adam's two moments)
_TABLE_BYTES = {"sinusoidal": 12, "learned": 16}


def _check_position_table(config: RunConfig) -> None:
    per_position = _TABLE_BYTES.get(config.model.position, 0)
    max_length, d_model = config.data.max_length, config.model.d_model
    check_memory(per_position * max(max_length, 16) * d_model,
                 f"data.max_length={max_length} (a position table of max_length x model.d_model={d_model})",
                 "data.max_length is where texts are cut: set it to what your texts need (64-512 is usual)")


def _check_pretrained(config: RunConfig, pretrained: str) -> None:
    """The checkpoint exists, is of a supported family, and takes ``data.max_length`` tokens."""
    directory = pretrained_dir(pretrained)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"model.pretrained={pretrained!r}: {directory} has no config.json")
    values = read_config(directory)
    if "encoder" in values or "decoder" in values:
        return  # an attnlab checkpoint: the loader says what to do with it
    family = family_for(values, source=f"model.pretrained={pretrained!r} ({config_path})")
    limit = family.config_from_hf(values, str(config_path)).max_len
    if config.data.max_length > limit:
        raise ValueError(f"data.max_length={config.data.max_length} is more than model.pretrained={pretrained!r} "
                         f"takes ({limit} positions); set data.max_length to {limit} or less")
