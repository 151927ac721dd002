"""Find a transformers model's attention modules and name them as attnlab does.

An attention module *routes through the registry* when its ``forward`` looks its
function up in transformers' ``ALL_ATTENTION_FUNCTIONS`` (every model of transformers
5.x written in the functional style). Names count layers from 1 in module order:
``layer_1, layer_2, ...`` for a model with one stack of self-attention; where a model
has several (an encoder and a decoder, a text and a vision tower) each stack's names
carry its role (``encoder.layer_1``, ``decoder.layer_1``, ``vision.layer_1``, ``language.layer_1``), and
cross-attention is always named apart (``cross.layer_1``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Optional

from torch import nn

__all__ = ["AttentionSite", "attention_sites", "unrouted_attention", "window_of"]

_CROSS = re.compile(r"cross|encdec|encoder_attn", re.IGNORECASE)
# Role words looked for in a stack's path, most specific first.
_ROLES = ("text", "vision", "audio", "image", "encoder", "decoder", "language")


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a transformers model.

    Attributes:
        name: attnlab's name (``layer_3``, ``cross.layer_2``, ``encoder.layer_1``).
        path: where it lives (``model.layers.2.self_attn``).
        module: the module.
        cross: whether its keys come from another sequence.
        heads: its number of query heads, when the module or its config says.
    """

    name: str
    path: str
    module: nn.Module
    cross: bool
    heads: Optional[int]


def routes_through_registry(module: nn.Module) -> bool:
    forward = inspect.unwrap(type(module).forward)
    code = getattr(forward, "__code__", None)
    return code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names


def _heads(module: nn.Module) -> Optional[int]:
    for owner, attribute in ((module, "num_heads"), (module, "num_attention_heads"), (module, "n_heads"),
                             (getattr(module, "config", None), "num_attention_heads")):
        value = getattr(owner, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _is_cross(path: str, module: nn.Module) -> bool:
    if getattr(module, "is_cross_attention", False) is True:
        return True
    return bool(_CROSS.search(".".join(path.split(".")[-2:])))  # crossattention.self, encoder_attn


def _stack_of(path: str) -> str:
    """The path up to the first layer index: ``model.layers.3.self_attn`` -> ``model.layers``."""
    parts = path.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:index])
    return ".".join(parts[:-1])


def _role(stack: str) -> str:
    lowered = stack.lower().replace("visual", "vision")  # Qwen2-VL's tower is model.visual
    return next((role for role in _ROLES if role in lowered), stack or "model")


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every routed attention module of ``model``, named (see the module docstring)."""
    found = [(path, module) for path, module in model.named_modules() if routes_through_registry(module)]
    groups: dict[tuple[str, bool], list[tuple[str, nn.Module]]] = {}
    for path, module in found:
        cross = _is_cross(path, module)
        groups.setdefault((_stack_of(path) if not cross else "", cross), []).append((path, module))
    self_stacks = [stack for stack, cross in groups if not cross]
    labels: dict[tuple[str, bool], str] = {}
    for stack, cross in groups:
        if cross:
            labels[(stack, cross)] = "cross"
        elif len(self_stacks) == 1:
            labels[(stack, cross)] = ""
        else:
            labels[(stack, cross)] = _role(stack)
    if len(set(labels.values())) < len(labels):  # two stacks with one role: their paths tell them apart
        labels = {key: ("cross" if key[1] else key[0]) for key in labels}
    sites = []
    for key, members in groups.items():
        prefix = f"{labels[key]}." if labels[key] else ""
        for index, (path, module) in enumerate(members):
            sites.append(AttentionSite(f"{prefix}layer_{index + 1}", path, module, key[1], _heads(module)))
    order = {path: index for index, (path, _) in enumerate(found)}
    return sorted(sites, key=lambda site: order[site.path])


def unrouted_attention(model: nn.Module) -> list[str]:
    """Paths of modules named like attention that compute it without the registry."""
    routed = [path for path, module in model.named_modules() if routes_through_registry(module)]
    unrouted = []
    for path, module in model.named_modules():
        if not path or "Attention" not in type(module).__name__ or routes_through_registry(module):
            continue
        related = any(other == path or other.startswith(path + ".") or path.startswith(other + ".")
                      for other in routed)
        has_projections = any(isinstance(child, nn.Linear) for child in module.children())
        if not related and has_projections:
            unrouted.append(path)
    return unrouted


def window_of(module: nn.Module, config: Any) -> Optional[int]:
    """A transformers attention module's sliding window: its own ``sliding_window`` (Gemma 2
    and 3, Qwen2: ``None`` on global layers), else the config's for every layer of a model
    without ``layer_types`` (Mistral)."""
    if hasattr(module, "sliding_window"):
        window = module.sliding_window
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        window = None if getattr(text, "layer_types", None) else getattr(text, "sliding_window", None)
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
