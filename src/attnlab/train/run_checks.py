"""Everything a run needs, checked before anything is written.

A start that fails on a typo (a device, a data file, a precision the device lacks) must
leave nothing behind that blocks the corrected command; so :func:`check_run` looks at the
config and the device first, and the run directory is written only after it passed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..data.text_files import read_labelled_texts
from ..data.tokenization import TOKENIZER_KINDS, load_tokenizer_file
from ..models.pretrained import pretrained_dir
from .run_config import RunConfig
from .tasks import DEFAULT_TASK

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
            raise FileNotFoundError(f"data file {path} does not exist (--data / data.path)")
        read_labelled_texts(path, text_column=data.text_column, label_column=data.label_column,
                            format=data.format)
    if data.tokenizer not in TOKENIZER_KINDS:
        load_tokenizer_file(data.tokenizer)
    pretrained = getattr(config.model, "pretrained", None)
    if pretrained:
        pretrained_dir(pretrained)
