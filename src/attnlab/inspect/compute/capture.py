"""Record every attention module's per-head weights without touching model code.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``L`` attention modules (layers).

:func:`capture_attention` puts two hooks on each attention module of a model: a forward
*pre*-hook that asks for the weights (``need_weights=True``, per head) and a forward
hook that keeps them. The hooks are removed in ``finally``, even when the forward
raises, and hooks the user registered are never touched.

An attention module is a :class:`~attnlab.attention.MultiHeadAttention` or any module
whose ``forward`` takes a keyword ``need_weights`` and returns ``(output, weights)``,
the innermost such module winning (an encoder layer forwards ``need_weights`` to its
attention; only the attention is hooked). A transformers model's attention modules
count too while :func:`attnlab.hf.attach` serves them: they pass ``need_weights`` and
``head_mask`` on to attnlab's attention function (:func:`serve_as_attention`).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ...attention.interface import is_served, names_attention_function, serve_as_attention, served_heads
from ...attention.multihead import MultiHeadAttention
from . import modes
from .inspectable import Inspectable, Site
from .query_rows import RowChoice
from .routing import Session, inspecting, route_of

__all__ = ["AttentionCapture", "capture_attention", "find_attention_modules", "attention_heads",
           "is_served", "serve_as_attention"]

def attention_heads(module: nn.Module) -> Optional[int]:
    """The number of heads of an attention module, when it says (``num_heads``)."""
    heads = getattr(module, "num_heads", None)
    if isinstance(heads, int) and not isinstance(heads, bool):
        return heads
    return served_heads(module)


def _takes_need_weights(module: nn.Module) -> bool:
    if isinstance(module, MultiHeadAttention) or is_served(module):
        return True
    try:
        parameters = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    return "need_weights" in parameters


def find_attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The model's attention modules in registration order, named ``layer_1, layer_2, ...``.

    The names match :class:`~attnlab.TransformerEncoder`'s ``attentions`` keys. A module
    that takes ``need_weights`` but contains another such module (an encoder layer around
    its attention) is skipped in favour of the inner one.

    Args:
        model: any ``nn.Module``.

    Returns:
        ``{"layer_1": module, ...}``; empty when the model has no attention module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(model, Inspectable):  # a model that names its own sites (a transformers model's stacks)
        return {site.name: site.module for site in model.attention_sites()}
    candidates = [(path, module) for path, module in model.named_modules() if _takes_need_weights(module)]
    paths = [path for path, _ in candidates]
    innermost = [
        (path, module)
        for path, module in candidates
        if not any(other != path and (path == "" or other.startswith(path + ".")) for other in paths)
    ]
    return {f"layer_{index + 1}": module for index, (_, module) in enumerate(innermost)}


def module_paths(model: nn.Module) -> dict[str, str]:
    """``{"layer_1": "layers.0.self_attn", ...}``: where each captured module lives."""
    by_identity = {id(module): path for path, module in model.named_modules()}
    return {name: by_identity[id(module)] for name, module in find_attention_modules(model).items()}


class AttentionCapture:
    """What :func:`capture_attention` yields: the weights of the most recent forward.

    Attributes:
        attentions: ``{"layer_1": [B, H, T, S], ...}`` from the latest call of each
            module (a module called twice in one forward keeps its last call).
        paths: ``{"layer_1": "layers.0.self_attn", ...}``, the module each name stands for.
        query_rows: ``{"layer_1": positions [R]}``: the query rows behind each layer's
            weights, when ``rows=`` chose some (``[B, H, R, S]``); empty otherwise.
    """

    def __init__(self, paths: dict[str, str]) -> None:
        self.attentions: dict[str, Tensor] = {}
        self.query_rows: dict[str, Tensor] = {}
        self.paths = paths

    def clear(self) -> None:
        """Forget the recorded weights (the hooks stay until the context ends)."""
        self.attentions = {}
        self.query_rows.clear()

    def stacked(self) -> Tensor:
        """All layers as one tensor ``[L, B, H, T, S]`` (layers must share their shapes)."""
        if not self.attentions:
            raise ValueError("nothing captured yet: run the model inside the capture_attention block")
        return torch.stack([self.attentions[name] for name in self.paths if name in self.attentions])

    def __repr__(self) -> str:
        shapes = {name: tuple(weights.shape) for name, weights in self.attentions.items()}
        return f"AttentionCapture({shapes})"


def weights_asker(module: nn.Module):
    """A forward pre-hook that asks ``module`` for its per-head weights (``need_weights``,
    and ``average_attn_weights=False`` where the module averages by default)."""
    per_head = {"need_weights": True}
    if (
        isinstance(module, MultiHeadAttention)
        or "average_attn_weights" in inspect.signature(module.forward).parameters
    ):
        per_head["average_attn_weights"] = False

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, {**kwargs, **per_head}

    return hook


def _recorder(capture: AttentionCapture, name: str, detach: bool):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        weights = output[1] if isinstance(output, (tuple, list)) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError(
                f"{name} ({type(module).__name__}) returned no attention weights although "
                f"need_weights=True was passed; it cannot be captured"
            )
        capture.attentions[name] = weights.detach() if detach else weights

    return hook


@contextlib.contextmanager
def capture_attention(
    model: nn.Module,
    *,
    eval_mode: bool = True,
    detach: bool = True,
    modules: Optional[Union[Sequence[nn.Module], Mapping[str, nn.Module]]] = None,
    rows: RowChoice = None,
) -> Iterator[AttentionCapture]:
    """Record per-layer, per-head attention weights of every forward inside the block.

    Args:
        model: any model built from attnlab attention modules (or modules with the same
            ``need_weights`` keyword).
        eval_mode: switch the model to eval mode inside the block, so the weights shown
            are the model's real ones (no dropout); each module's previous mode is
            restored afterwards.
        detach: store detached weights (set ``False`` to keep them in the autograd graph).
        modules: capture exactly these modules (named ``layer_1, ...`` in the given
            order, or by the keys of a ``{name: module}`` mapping) instead of searching
            the model.
        rows: keep only these query rows' weights over every key (``[B, H, R, S]``): the
            last ``k`` (an int), a slice, or positions; the module's output comes from its
            fused kernel and no ``[T, S]`` map is made (modules that call attnlab's attention
            functions; another kind is refused).

    Yields:
        :class:`AttentionCapture` whose ``attentions`` fill in as the model runs.

    Shape:
        each captured tensor is ``[B, H, T, S]``.

    Example:
        >>> with capture_attention(model) as captured:
        ...     model(ids)
        >>> captured.attentions["layer_1"].shape
        torch.Size([1, 4, 6, 6])
    """
    if modules is None:
        found = find_attention_modules(model)
        paths = module_paths(model)
    else:
        found = dict(modules) if isinstance(modules, Mapping) else {
            f"layer_{index + 1}": module for index, module in enumerate(modules)}
        by_identity = {id(module): path for path, module in model.named_modules()}
        paths = {name: by_identity.get(id(module), "?") for name, module in found.items()}
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention module to capture (looked for "
            f"MultiHeadAttention or a forward with a need_weights keyword)"
        )
    capture = AttentionCapture(paths)
    # Every module is asked for its weights (need_weights). attnlab's own modules record
    # them in the inspecting attention function, which serves transformers modules too;
    # any other module's are taken from its output by a hook.
    routable = {name: module for name, module in found.items()
                if names_attention_function(module) and route_of(module) is None}
    if rows is not None and len(routable) < len(found):
        other = next(name for name in found if name not in routable)
        raise ValueError(f"rows=: {other} ({type(found[other]).__name__}) does not call attnlab's attention "
                         f"functions, so its weights come whole; capture without rows, or leave that module out")
    sites = [Site(name, paths.get(name, "?"), module, attention_heads(module), False, False)
             for name, module in routable.items()]
    session = _CaptureSession(capture, model, sites, detach, rows)
    handles = []
    try:
        for name, module in found.items():
            handles.append(module.register_forward_pre_hook(weights_asker(module), with_kwargs=True))
            if name not in routable:
                handles.append(module.register_forward_hook(_recorder(capture, name, detach)))
        with modes.eval_mode(model) if eval_mode else contextlib.nullcontext(), \
                inspecting(session) if sites else contextlib.nullcontext():
            yield capture
    finally:
        for handle in handles:
            handle.remove()


class _CaptureSession(Session):
    """Every routed module's exact weights, kept in the capture as each call makes them."""

    def __init__(self, capture: AttentionCapture, model: nn.Module, sites: list[Site], detach: bool,
                 rows: RowChoice = None) -> None:
        super().__init__(model, sites, {site.name for site in sites}, None, not detach, False, {},
                         refuse_shared_modules=False, rows=rows)
        self.capture = capture
        self.query_rows = capture.query_rows  # one dict, filled as the session records

    def _record(self, site: Site, weights: Tensor) -> None:
        super()._record(site, weights)
        self.capture.attentions[site.name] = weights
