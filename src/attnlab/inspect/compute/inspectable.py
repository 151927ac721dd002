"""What a model offers to be looked inside: one protocol that both doors implement.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length,
``L`` attention layers, ``E`` width, ``V`` vocabulary.

attnlab opens models through two doors: its own re-implemented architectures, and any
transformers model served by attnlab's attention function
(:class:`~attnlab.hf.opening.TransformersModel`). The features that look inside (the
analyzer, generation with attention, the logit lens, explanations, ...) are written once
against :class:`Inspectable`, as TransformerLens writes its tools once against named
hook points and transformers its models against one attention function:

* :meth:`~Inspectable.attention_sites` -- every attention module, named ``layer_1``,
  ``layer_2``, ... (``cross.layer_1``, ``encoder.layer_1`` where a model has several
  stacks), with its heads, whether it is cross-attention and whether it is causal;
* :meth:`~Inspectable.record` -- the exact per-head weights of chosen layers, with or
  without gradients;
* :meth:`~Inspectable.statistics` -- per-head statistics reduced as the weights are made,
  never keeping them (a transformers model: blocks of query rows inside attnlab's attention
  function; attnlab's own: each layer's map reduced as soon as it is made);
* :meth:`~Inspectable.intervene` and :meth:`~Inspectable.head_outputs` -- heads scaled,
  switched off, recorded or patched at one point: each head's output before the output
  projection mixes the heads;
* :meth:`~Inspectable.input_embeddings` (gradient methods), :meth:`~Inspectable.readout`
  (final norm + head: the logit lens), ``label_names``, and :meth:`~Inspectable.generate`
  (every step's attention).

A feature a model cannot offer is a stated capability: :meth:`~Inspectable.unsupported`
gives the one-line reason (``None``: offered), and :func:`require` raises it.
:func:`inspectable` returns what a model offers: the model itself when it implements the
protocol (a ``TransformersModel``), :class:`~attnlab.inspect.compute.own_model.OwnModel`
around attnlab's own models, and a transformers model wrapped by the door that serves it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Mapping, Optional, Protocol, Sequence, Union, \
    runtime_checkable

from torch import Tensor, nn

from .query_rows import RowChoice

__all__ = ["FEATURES", "Inspectable", "NotOffered", "Site", "inspectable", "require", "residual_blocks",
           "shared_reason", "sliding_window", "special_ids_of"]

# What a model may offer, with what each name means (the feature matrix's rows ask for these).
FEATURES: dict[str, str] = {
    "one_sequence": "one token axis shared by every layer (not an encoder-decoder's two texts)",
    "record": "exact per-head weights of chosen layers, with or without gradients",
    "statistics": "per-head statistics over a data set, reduced as the weights are made",
    "intervene": "heads scaled or switched off before the output projection",
    "head_outputs": "each head's output before the output projection, recorded or replaced (patching)",
    "blocks": "the layers (residual blocks) holding the attention sites, for layer patching",
    "input_embeddings": "the token embedding, for gradient methods",
    "readout": "the final norm and head that turn a hidden state into logits (logit lens)",
    "labels": "class names of a classifier",
    "generate": "generation with every step's attention",
}

HeadMask = Union[Tensor, Mapping[str, Iterable[int]]]


@dataclass(frozen=True)
class Site:
    """One attention module, as every feature names it.

    Attributes:
        name: ``layer_3`` (counted from 1), ``cross.layer_2``, ``encoder.layer_1``, ...
        path: where the module lives in the model (``layers.2.attention``).
        module: the module.
        heads: its number of query heads, when it says.
        cross: whether its keys come from another sequence.
        causal: whether each query sees only the keys before it.
        window: a local layer's sliding window ``W`` (its query at ``t`` sees the keys
            ``s`` with ``t - s < W``); ``None`` for a global layer.
    """

    name: str
    path: str
    module: nn.Module
    heads: Optional[int]
    cross: bool
    causal: bool
    window: Optional[int] = None


def sliding_window(sites: Iterable[Site]) -> Optional[int]:
    """The widest sliding window of a model's causal self-attention sites, ``None`` when none
    has one: the statistics measure what every layer reads beyond it (``beyond_window``)."""
    windows = [site.window for site in sites if site.causal and not site.cross and site.window]
    return max(windows) if windows else None


class NotOffered(ValueError):
    """A feature the model cannot offer; the message says why, in one line."""


@runtime_checkable
class Inspectable(Protocol):
    """What a model offers to be looked inside (see the module docstring).

    It is called as attnlab's models are called: ``view(input_ids, mask=mask)``.

    Attributes:
        architecture: the model's class name (``EncoderClassifier``, ``Qwen3ForCausalLM``).
        kind: ``"encoder"``, ``"decoder"``, ``"encoder-decoder"``, ``"vision"``,
            ``"speech"``, ``"image-text"``, ...
        label_names: a classifier's class names, else ``None``.
        special_ids: ``{"pad": [ids], "bos": [...], "eos": [...]}``: the special tokens the
            model's config names (a list each: some models end on several tokens).
    """

    architecture: str
    kind: str
    label_names: Optional[list[str]]
    special_ids: dict[str, list[int]]

    def __call__(self, input_ids: Tensor, mask: Optional[Tensor] = None, **kwargs: Any) -> Any:
        """The model's forward, as attnlab's models take it."""

    def attention_sites(self) -> list[Site]:
        """Every attention module, in the order the model runs them."""

    def unsupported(self, feature: str) -> Optional[str]:
        """Why ``feature`` (a key of :data:`FEATURES`) is not offered, or ``None``."""

    def record(self, *, layers: Optional[Sequence[str]] = None, grad: bool = False,
               rows: RowChoice = None) -> ContextManager[Any]:
        """Inside the block, forwards keep the weights of ``layers`` (names; default every
        layer) in ``.attentions`` (``{name: [B, H, T, S]}``), in the graph when ``grad``.
        ``rows`` keeps only chosen query rows' weights (``[B, H, R, S]``, positions in
        ``.query_rows``): the last ``k``, a slice, or positions
        (:mod:`~attnlab.inspect.compute.query_rows`); no ``[T, S]`` map is made."""

    def statistics(self, *, sparsity_threshold: float = 0.1, top_k: int = 3,
                   token_groups: Optional[Mapping[str, Iterable[int]]] = None) -> ContextManager[Any]:
        """Inside the block, forwards add to per-head statistics without keeping the weights;
        the object yielded gives ``means()`` (``{layer: {statistic: [per head]}}``) and
        ``row_counts()``."""

    def intervene(self, *, head_mask: HeadMask) -> ContextManager[Tensor]:
        """Inside the block, each head's output is multiplied by ``head_mask`` (``[L, H]``,
        or ``{"layer_2": [0, 3]}``: heads to remove, 0-based) before the output projection."""

    def head_outputs(self, layers: Sequence[str], *,
                     replace: Optional[Mapping[str, tuple[Tensor, Tensor]]] = None) -> ContextManager[dict]:
        """Inside the block, each forward records the per-head outputs ``[B, T, H, D]`` of
        ``layers`` (before the output projection mixes them) in the dict yielded; with
        ``replace`` (``{layer: ([H] bool heads, [B, T, H, D] values)}``) those heads'
        outputs are replaced by the values first."""

    def blocks(self) -> list[tuple[str, nn.Module]]:
        """The layers holding the attention sites, in order, by path (:func:`residual_blocks`)."""

    def input_embeddings(self) -> nn.Module:
        """The token embedding (ids -> ``[B, T, E]``)."""

    def readout(self) -> Callable[[Tensor], Tensor]:
        """``hidden [.., E] -> logits [.., V]``: the final norm, then the head."""

    def generate(self, input_ids: Tensor, *, attention_mask: Optional[Tensor] = None, max_new_tokens: int = 20,
                 **options: Any) -> Any:
        """Continue ``input_ids`` and record every step's attention
        (:class:`~attnlab.models.decoder.generation.GenerationOutput`)."""


def special_ids_of(config: Any) -> dict[str, list[int]]:
    """``{"pad": [..], "bos": [..], "eos": [..]}`` from a config: attnlab's (``pad_id``,
    ``bos_id``, ``eos_id``) or transformers' (``pad_token_id``, ...); an id or a list of ids."""
    found: dict[str, list[int]] = {}
    for name in ("pad", "bos", "eos"):
        value = getattr(config, f"{name}_id", None)
        if value is None:
            value = getattr(config, f"{name}_token_id", None)
        values = value if isinstance(value, (list, tuple)) else [value]
        found[name] = [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return found


def residual_blocks(root: nn.Module, sites: Sequence[Site]) -> list[tuple[str, nn.Module]]:
    """The layers (residual blocks) that hold ``sites``, in the order the sites run: each
    site's nearest ancestor that is an item of a module list (a path ending in a number,
    ``model.layers.3`` for ``model.layers.3.self_attn``, ``bert.encoder.layer.3`` for
    ``bert.encoder.layer.3.attention.self``); a layer holding two sites (self- and
    cross-attention) counts once."""
    found: dict[str, nn.Module] = {}
    for site in sites:
        parts = site.path.split(".")
        cut = max((index for index, part in enumerate(parts[:-1]) if part.isdigit()), default=None)
        if cut is not None:
            path = ".".join(parts[:cut + 1])
            found.setdefault(path, root.get_submodule(path))
    return list(found.items())


def shared_reason(view: Inspectable, feature: str) -> Optional[str]:
    """:meth:`Inspectable.unsupported` for what both doors decide alike (heads that say
    their number, layers that hold the sites, label names); ``None`` for any other known
    feature, which each door checks before it asks here."""
    name = view.architecture
    if feature == "intervene":
        unknown = next((site for site in view.attention_sites() if site.heads is None), None)
        return None if unknown is None else f"{unknown.path} does not say its number of heads"
    if feature == "blocks":
        return None if view.blocks() else f"{name}'s attention modules sit in no list of layers"
    if feature == "labels":
        return None if view.label_names else f"{name} is not a classifier with label names"
    if feature in FEATURES:
        return None
    raise ValueError(f"unknown feature {feature!r}; one of {', '.join(FEATURES)}")


def require(view: Inspectable, feature: str, what: str = "") -> None:
    """Raise :class:`NotOffered` when ``view`` does not offer ``feature``; ``what`` names
    the caller (``"--importance"``, ``"the logit lens"``) in the message."""
    if feature not in FEATURES:
        raise ValueError(f"unknown feature {feature!r}; one of {', '.join(FEATURES)}")
    reason = view.unsupported(feature)
    if reason is not None:
        raise NotOffered(f"{what or feature}: {reason}")


# The doors: a module prefix of the model's class -> the attnlab module whose
# ``as_inspectable(model)`` serves it; attnlab's own models (any other module) take the last.
# Imported by name when first needed, so that the protocol imports neither door.
DOORS: dict[str, str] = {"transformers.": "attnlab.hf.opening"}
OWN_DOOR = "attnlab.inspect.compute.own_model"

# AttnLRP's rules for the modules a door serves (:mod:`~attnlab.inspect.compute.attn_lrp_rules`
# asks): a module prefix of a module's class -> the attnlab module whose ``rule_for(module)``
# knows them, imported by name when a model holds one.
ATTN_LRP_RULES: dict[str, str] = dict.fromkeys(("transformers.", "attnlab.hf."), "attnlab.hf.attn_lrp_rules")


def door_rules(module_name: str) -> Optional[Any]:
    """The AttnLRP rule table (a module with ``rule_for`` and ``FAMILIES``) of the door serving
    classes of ``module_name``, or ``None`` when no door has one."""
    table = next((table for prefix, table in ATTN_LRP_RULES.items() if module_name.startswith(prefix)), None)
    return None if table is None else importlib.import_module(table)


def inspectable(model: Any) -> Inspectable:
    """What ``model`` offers to be looked inside.

    Args:
        model: an :class:`Inspectable` (returned as it is), one of attnlab's models
            (:class:`~attnlab.inspect.compute.own_model.OwnModel` around it), or a
            transformers model (wrapped by :class:`~attnlab.hf.opening.TransformersModel`:
            its attention served by attnlab's function from now on).

    Raises:
        TypeError: ``model`` is not a torch module.
        ValueError: it has no attention module attnlab can see.
    """
    if isinstance(model, Inspectable) and not isinstance(model, type):
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a model (torch.nn.Module), got {type(model).__name__}")
    door = next((module for prefix, module in DOORS.items() if type(model).__module__.startswith(prefix)), OWN_DOOR)
    return importlib.import_module(door).as_inspectable(model)
