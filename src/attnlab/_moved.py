"""Old module paths of attnlab's public modules, still importable after they moved.

:data:`MOVED` maps an old dotted path (a module, or a package and everything under it)
to where it lives now. ``import attnlab.models.pretrained`` then gives the module
``attnlab.checkpoints.encoders.loading`` itself (the same object, so a name patched through
either path is patched once). New code imports the new paths; this table only keeps
code written against the old ones working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Optional

__all__ = ["MOVED", "new_name", "install"]

MOVED: dict[str, str] = {
    "attnlab.models.checkpoint_tensors": "attnlab.checkpoints.tensors",
    "attnlab.models.decoder._gpt2_layout": "attnlab.checkpoints.decoders._gpt2_layout",
    "attnlab.models.decoder._llama_layout": "attnlab.checkpoints.decoders._llama_layout",
    "attnlab.models.decoder.gguf_tokenizer": "attnlab.checkpoints.gguf.tokenizer",
    "attnlab.models.decoder.gguf_weights": "attnlab.checkpoints.gguf.weights",
    "attnlab.models.decoder.loading": "attnlab.checkpoints.decoders.loading",
    "attnlab.models.decoder.saving": "attnlab.checkpoints.decoders.saving",
    "attnlab.models.factory": "attnlab.checkpoints.factory",
    "attnlab.models.families": "attnlab.checkpoints.encoders",
    "attnlab.models.families._convert": "attnlab.checkpoints._convert",
    "attnlab.models.families._table": "attnlab.checkpoints._table",
    "attnlab.models.loading": "attnlab.checkpoints.loading",
    "attnlab.models.pretrained": "attnlab.checkpoints.encoders.loading",
    "attnlab.models.serialization": "attnlab.checkpoints.attnlab_layout",
    "attnlab.attention.block_sparse": "attnlab.attention.sparse.block_sparse",
    "attnlab.attention.sparse_pattern": "attnlab.attention.sparse.pattern",
    "attnlab.layers.scaled_rotary": "attnlab.attention.rotary",
    "attnlab.layers.swiglu_ffn": "attnlab.layers.ffn",
}


def new_name(old: str) -> Optional[str]:
    """Where the module once called ``old`` lives now, or ``None`` when it did not move."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before):]
    return None


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in :data:`MOVED` and hands back the module at its new path."""

    def find_spec(self, fullname: str, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(new_name(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran at its new path."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
