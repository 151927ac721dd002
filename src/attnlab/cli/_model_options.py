"""The options every command that loads a model shares: ``--model``'s help, ``--dtype``
(:func:`add_dtype_argument`) and the one line saying which dtype the weights are in
(:func:`dtype_line`). What ``--model`` names is opened by
:func:`attnlab.workflows.resolve.resolve_model`."""

from __future__ import annotations

import argparse

from ..workflows.resolve import DEFAULT_DTYPE, ResolvedModel

__all__ = ["MODEL_HELP", "add_dtype_argument", "dtype_line"]

MODEL_HELP = ("what attnlab.load opens: a run or checkpoint directory, a HuggingFace directory, "
              "a .gguf file, or a packaged name (minilm, smollm2)")


def add_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """``--dtype``: the dtype the model's weights are loaded in."""
    from ..checkpoints.tensors import DTYPE_CHOICES

    parser.add_argument(
        "--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES,
        help="dtype of the model's weights: float32 (default), bfloat16, float16, or auto (the "
             "checkpoint's own, from its safetensors or config.json)",
    )


def dtype_line(resolved: ResolvedModel) -> str:
    """One line saying which dtype ``resolved``'s weights are in and why."""
    names = {str(parameter.dtype).removeprefix("torch.") for parameter in resolved.model.parameters()}
    used = "/".join(sorted(names)) or "none"
    why = {DEFAULT_DTYPE: "the default; --dtype to change", "auto": "--dtype auto: the checkpoint's own"}
    return f"dtype: {used} for {resolved.name} ({why.get(resolved.dtype, '--dtype')})"
