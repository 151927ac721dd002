"""Old module paths of attnlab's public modules, still importable after they moved.

:data:`MOVED` maps an old dotted path (a module, or a package and everything under it)
to where it lives now. ``import attnlab.models.pretrained`` then gives the module
``attnlab.checkpoints.encoders.loading`` itself (the same object, so a name patched through
either path is patched once), and ``python -m attnlab.demo`` runs ``attnlab.cli.demo``. New
code imports the new paths; this table only keeps code written against the old ones working.

When a module's names split between two new homes, the old path maps to the module that
imports them all (``attnlab.layers.encoder`` -> :mod:`attnlab.models.encoder`, which imports
the layer it stacks). A package or module that lost some of its names keeps them through
:data:`MOVED_NAMES` and :func:`moved_names` (its ``__getattr__``), so that it need not import
the module above it; a name that was renamed on the way is written ``module:new_name``
(``attnlab._native.enabled`` is ``attnlab._dispatch.native_enabled``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import CodeType, ModuleType
from typing import Any, Callable, Optional

__all__ = ["MOVED", "MOVED_NAMES", "install", "moved_names", "new_name"]

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
    "attnlab.layers.encoder": "attnlab.models.encoder",
    "attnlab.hf.image_preprocessing": "attnlab.data.images",
    "attnlab.inspect.commands": "attnlab.workflows",
    "attnlab.inspect.commands.analyze_texts": "attnlab.workflows.analyze_texts",
    "attnlab.inspect.commands.compare_models": "attnlab.workflows.compare_models",
    "attnlab.inspect.commands.explain_generation": "attnlab.workflows.explain_generation",
    "attnlab.inspect.commands.explain_image": "attnlab.workflows.explain_image",
    "attnlab.inspect.commands.explain_text": "attnlab.workflows.explain_text",
    "attnlab.inspect.commands.generate_text": "attnlab.workflows.generate_text",
    "attnlab.inspect.commands.inspect_image": "attnlab.workflows.inspect_image",
    "attnlab.inspect.commands.inspect_pair": "attnlab.workflows.inspect_pair",
    "attnlab.inspect.commands.inspect_text": "attnlab.workflows.inspect_text",
    "attnlab.inspect.commands.inspect_vision_language": "attnlab.workflows.inspect_vision_language",
    "attnlab.inspect.commands.resolve": "attnlab.workflows.resolve",
    "attnlab.demo": "attnlab.cli.demo",
    "attnlab._command_errors": "attnlab.cli._errors",
    "attnlab.train.command": "attnlab.cli.train",
    "attnlab.serve.command": "attnlab.cli.serve",
    "attnlab.inspect.commands.inspect_command": "attnlab.cli.inspect",
    "attnlab.inspect.commands.analyze_command": "attnlab.cli.analyze",
    "attnlab.inspect.commands.generate_command": "attnlab.cli.generate",
    "attnlab.inspect.commands.explain_command": "attnlab.cli.explain",
    "attnlab.inspect.commands.heads_command": "attnlab.cli.heads",
    "attnlab.inspect.commands.compare_command": "attnlab.cli.compare",
    "attnlab.inspect.commands.align_command": "attnlab.cli.align",
    "attnlab.inspect.commands.image_attention_command": "attnlab.cli.image_attention",
    "attnlab.attention.sparse._block_window_native": "attnlab.attention.sparse._block_window_amx",
    "attnlab.attention.sparse._kernel_choice": "attnlab._dispatch",
    "attnlab._paths": "attnlab._dispatch",
}

# package or module -> {name it no longer holds: the module that holds it now[:its new name]}
MOVED_NAMES: dict[str, dict[str, str]] = {
    "attnlab.layers": {
        "TransformerEncoder": "attnlab.models.encoder",
        "EncoderOutput": "attnlab.models.encoder",
    },
    "attnlab.inspect": {
        **dict.fromkeys(("Explanation", "explain", "write_explanation"), "attnlab.workflows.explain_text"),
        **dict.fromkeys(("Comparison", "compare_models", "write_comparison"), "attnlab.workflows.compare_models"),
        **dict.fromkeys(("GenerationExplanation", "explain_generation", "write_generation_explanations"),
                        "attnlab.workflows.explain_generation"),
    },
    "attnlab.hf.vision": {"load_image": "attnlab.data.images"},
    "attnlab.hf.audio": {"read_wav": "attnlab.data.audio"},
    "attnlab.workflows.resolve": dict.fromkeys(("MODEL_HELP", "add_dtype_argument", "dtype_line"),
                                               "attnlab.cli._model_options"),
    # the switches and the choices they make went to the one dispatch module
    "attnlab._native": {
        "enabled": "attnlab._dispatch:native_enabled",
        "status": "attnlab._dispatch:native_status",
        "unavailable_reason": "attnlab._dispatch:native_unavailable_reason",
        "warn_once": "attnlab._dispatch:warn_once",
    },
    "attnlab._threads": {"adaptive": "attnlab._dispatch:threads_adaptive"},
    # attention.sparse._kernel_choice's names, in the module that took its place
    "attnlab._dispatch": {
        "CHOICES": "attnlab._dispatch:SPARSE_KERNEL_CHOICES",
        "VARIABLE": "attnlab._dispatch:SPARSE_KERNEL_VARIABLE",
        "requested_kernel": "attnlab._dispatch:requested_sparse_kernel",
    },
}


def new_name(old: str) -> Optional[str]:
    """Where the module once called ``old`` lives now, or ``None`` when it did not move.

    The longest old path that ``old`` is, or lies under, decides: a module that moved on
    its own wins over the package it was in (``attnlab.models.families._convert`` is not
    ``attnlab.checkpoints.encoders._convert``).
    """
    matches = [before for before in MOVED if old == before or old.startswith(before + ".")]
    if not matches:
        return None
    before = max(matches, key=len)
    return MOVED[before] + old[len(before):]


def moved_names(package: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` (a package or a module) that hands out the
    names :data:`MOVED_NAMES` says went elsewhere (the objects themselves, imported when first
    asked for), and its submodules that moved (``attnlab.layers.encoder`` as an attribute of
    ``attnlab.layers``)."""
    names = MOVED_NAMES.get(package, {})

    def __getattr__(name: str) -> Any:
        if name in names:
            module, _, new = names[name].partition(":")
            return getattr(importlib.import_module(module), new or name)
        if f"{package}.{name}" in MOVED:
            return importlib.import_module(MOVED[f"{package}.{name}"])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in :data:`MOVED` and hands back the module at its new path."""

    def find_spec(self, fullname: str, path=None, target=None):
        if new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec) -> ModuleType:
        module = importlib.import_module(new_name(spec.name))
        # The import system gives the module the old path's spec next; the module keeps its
        # own (its relative imports inside functions resolve against its spec's package).
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran at its new path. It gets its own spec back."""
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname: str) -> CodeType:
        """What ``python -m OLD`` runs: the module at its new path, as the main module."""
        source = f"import runpy\nrunpy.run_module({new_name(fullname)!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{fullname}, now {new_name(fullname)}>", "exec")


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModules())
