"""The options every command that loads a model shares: ``--model``'s help, ``--dtype``
(:func:`add_dtype_argument`), ``--device-map``, ``--max-memory`` and ``--offload-dir``
(:func:`add_placement_arguments`, read by :func:`placement_from_args`) and the one line saying
which dtype the weights are in (:func:`dtype_line`). What ``--model`` names is opened by
:func:`attnlab.workflows.resolve.resolve_model`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

from ..workflows.resolve import DEFAULT_DTYPE, ResolvedModel

if TYPE_CHECKING:
    from ..hf.placement import Placement

__all__ = ["MODEL_HELP", "add_dtype_argument", "add_placement_arguments", "dtype_line", "placement_from_args"]

MODEL_HELP = ("what attnlab.load opens: a run or checkpoint directory, a HuggingFace directory, "
              "a .gguf file, or a packaged name (minilm, smollm2, gemma3-270m)")


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """``--dtype``: the dtype the model's weights are loaded in."""
    from ..checkpoints.tensors import DTYPE_CHOICES

    parser.add_argument(
        "--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES,
        help="dtype of the model's weights: float32 (default), bfloat16, float16, or auto (the "
             "checkpoint's own, from its safetensors or config.json)",
    )


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device-map``, ``--max-memory``, ``--offload-dir``: a model larger than a device,
    spread by accelerate over the GPUs, the CPU and the disk (the ``big`` extra)."""
    from ..hf.placement import DEVICE_MAPS

    group = parser.add_argument_group(
        "models larger than a device (pip install 'attnlab[big]')",
        "a HuggingFace directory opens through transformers and accelerate, whatever its family, each layer "
        "where the map puts it; attnlab runs, checkpoints and GGUF files open whole")
    group.add_argument("--device-map", default=None, choices=DEVICE_MAPS,
                       help="how accelerate spreads the layers over the devices (default: not at all; "
                            "--max-memory or --offload-dir alone mean auto)")
    group.add_argument("--max-memory", default=None, metavar="DEVICE=SIZE,...",
                       help="each device's budget, e.g. cpu=300MB or 0=20GiB,cpu=30GiB (GPUs by index; "
                            "KB, MB, GB are powers of 10, KiB, MiB, GiB powers of 2); the rest goes to disk")
    group.add_argument("--offload-dir", default=None, metavar="DIR",
                       help="a new or empty folder for the layers put on disk (needed when any are); "
                            "files already there are never written over")


def placement_from_args(args: argparse.Namespace) -> Optional["Placement"]:
    """The placement ``--device-map``, ``--max-memory`` and ``--offload-dir`` ask for, checked
    (``None`` when none is given); accelerate missing is one line too."""
    from ..hf.placement import COMMAND_LINE, placement

    try:
        return placement(getattr(args, "device_map", None), getattr(args, "max_memory", None),
                         getattr(args, "offload_dir", None), names=COMMAND_LINE)
    except ImportError as error:
        raise ValueError(str(error)) from None


def dtype_line(resolved: ResolvedModel) -> str:
    """One line saying which dtype ``resolved``'s weights are in and why."""
    names = {str(parameter.dtype).removeprefix("torch.") for parameter in resolved.model.parameters()}
    used = "/".join(sorted(names)) or "none"
    why = {DEFAULT_DTYPE: "the default; --dtype to change", "auto": "--dtype auto: the checkpoint's own"}
    return f"dtype: {used} for {resolved.name} ({why.get(resolved.dtype, '--dtype')})"
