"""Eval mode for the length of a block, each module's own mode given back after.

``model.train()`` afterwards would be wrong for a model that was partly frozen in eval mode
(a fine-tuning run's frozen encoder), so each module's flag is saved and restored, in
``finally``, even when the block raises.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block (no dropout); every module's mode restored after."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes.items():
            module.training = training
