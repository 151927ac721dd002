"""Tensors between a HuggingFace checkpoint and attnlab's modules: the one converter.

A conversion is a table of ``(HF names, attnlab name, stored transposed)``: several HF
names are one attnlab tensor, concatenated (query, key and value into one projection).
:func:`gather` reads a checkpoint through such a table, each tensor looked up once (a
:class:`~attnlab.checkpoints.tensors.CheckpointTensors` reads it then), and
:func:`scatter` writes a state dict back through it.

* Encoder families (:class:`Family`): names are found from the model attnlab builds (every
  tensor of its ``state_dict`` is looked up in the family's table), so the expected HF
  names and shapes are exactly what the encoder and its task head need
  (:func:`hf_to_state`, :func:`state_to_hf`).
* Decoder layouts (GPT-2, the Llama family): the layout lists its table for a config
  (:func:`read_layout`, :func:`write_layout`).

Every disagreement (a missing, unexpected or misshapen tensor) is reported at once.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor

from ._table import Family
from .errors import UnsupportedCheckpointError, problems_error

__all__ = ["Plan", "gather", "hf_names", "hf_to_state", "read_layout", "scatter", "state_to_hf", "write_layout"]

# (HF names, attnlab name, stored transposed): one row per attnlab tensor
Plan = list[tuple[tuple[str, ...], str, bool]]
_LM_HEAD = "lm_head.weight"

_QKV = {"self_attn.in_proj_weight": "weight", "self_attn.in_proj_bias": "bias"}


def _split(name: str) -> tuple[str, str]:
    module, _, leaf = name.rpartition(".")
    return module, leaf


def _encoder_name(family: Family, values: dict[str, Any], name: str) -> list[str]:
    """The HF name(s) of one encoder tensor (three for query, key and value).

    ``family.embeddings`` is looked up first, so it may also name a module inside a layer
    that HF keeps outside the layers (DeBERTa's shared relative-position table).
    """
    module, leaf = _split(name)
    if module in family.embeddings:
        return [f"{family.embeddings[module]}.{leaf}"]
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        prefix = family.layer_prefix.format(family.hf_layer(values, int(index)))
        if rest in _QKV:
            parts = (family.qkv,) if isinstance(family.qkv, str) else family.qkv
            return [f"{prefix}{part}.{_QKV[rest]}" for part in parts]
        module, leaf = _split(rest)
        table = family.layer
    else:
        prefix = ""
        module, leaf = _split(name)
        table = family.embeddings
    if module not in table:
        raise AssertionError(f"the {family.name} table has no entry for {name}")
    return [f"{prefix}{table[module]}.{leaf}"]


def hf_names(
    family: Family, values: dict[str, Any], state_names: list[str], head: Mapping[str, str]
) -> dict[str, list[str]]:
    """attnlab ``state_dict`` name -> HF names.

    Encoder names (under ``encoder.`` in a task model) come without the family's base
    prefix; ``head`` maps the task head's module paths to full HF module paths.
    """
    names = {}
    for name in state_names:
        module, leaf = _split(name)
        if name in head:  # a tensor mapped on its own (a masked-LM decoder's bias)
            names[name] = [head[name]]
        elif module in head:
            names[name] = [f"{head[module]}.{leaf}"]
        elif head:
            names[name] = _encoder_name(family, values, name.removeprefix("encoder."))
        else:
            names[name] = _encoder_name(family, values, name)
    return names


def _normalise(name: str) -> str:
    """Old ``LayerNorm.gamma``/``beta`` names as today's ``weight``/``bias``."""
    if name.endswith("LayerNorm.gamma"):
        return name[: -len("gamma")] + "weight"
    if name.endswith("LayerNorm.beta"):
        return name[: -len("beta")] + "bias"
    return name


def hf_to_state(
    family: Family,
    values: dict[str, Any],
    tensors: Mapping[str, Tensor],
    shapes: dict[str, tuple[int, ...]],
    *,
    head: Mapping[str, str] = {},
    ignored: tuple[str, ...] = (),
    strict: bool = True,
    source: str = "checkpoint",
) -> tuple[dict[str, Tensor], list[str]]:
    """Map HF tensors onto an attnlab model's ``state_dict`` names.

    Args:
        family: the layout.
        values: the checkpoint's ``config.json``.
        tensors: HF name -> tensor, as read from ``model.safetensors``; a
            :class:`~attnlab.checkpoints.tensors.CheckpointTensors` is read one
            tensor at a time, after every name and shape has been checked on its headers.
        shapes: the attnlab model's ``state_dict`` names and shapes.
        head: the task head's module paths -> full HF module paths (empty for an encoder).
        ignored: more HF names (prefixes) to skip, besides the family's.
        strict: with ``False``, tensors nothing has a place for are skipped, not refused.
        source: where the tensors came from, for messages.

    Returns:
        ``(state_dict, skipped)``: attnlab's tensors, and the HF names present but unused.

    Raises:
        UnsupportedCheckpointError: listing every missing, unexpected or misshapen tensor.
    """
    given = {_normalise(name): name for name in tensors}  # normalised -> stored name
    prefix = family.base_prefix
    head_names = {f"{path}.{leaf}" for path in head.values() for leaf in ("weight", "bias")} | set(
        head.values()
    )

    def lookup(name: str) -> str | None:
        if name in head_names:
            return name if name in given else None
        for candidate in (name, prefix + name):
            if candidate in given:
                return candidate
        return None

    names = hf_names(family, values, list(shapes), head)
    used, missing, mismatched = set(), {}, {}
    for ours, theirs in names.items():
        expected = list(shapes[ours])
        if len(theirs) == 3:
            expected[0] //= 3
        for name in theirs:
            found = lookup(name)
            if found is None:
                missing[name] = None
                continue
            used.add(found)
            stored = _stored_shape(tensors, given[found])
            if stored != tuple(expected):
                mismatched[name] = f"checkpoint {stored}, config expects {tuple(expected)}"
    unused = sorted(set(given) - used)
    skip = family.ignored + tuple(ignored)
    ignorable = [
        name for name in unused if name.removeprefix(prefix).startswith(skip) or name.startswith(skip)
    ]
    extra = [name for name in unused if name not in ignorable]
    problems = [f"missing tensor {name}" for name in missing]
    if strict:
        problems += [f"unexpected tensor {name}" for name in extra]
    problems += [f"shape mismatch {name}: {why}" for name, why in mismatched.items()]
    if problems:
        hint = " (pass strict=False to skip unexpected tensors)" if strict and extra else ""
        raise problems_error(f"{source} does not match a {family.name} model of this config{hint}", problems)
    plan = [(tuple(given[lookup(name)] for name in theirs), ours, False) for ours, theirs in names.items()]
    return gather(tensors, plan), sorted(ignorable + (extra if not strict else []))


def _stored_shape(tensors: Mapping[str, Tensor], name: str) -> tuple[int, ...]:
    """A tensor's shape without reading it when ``tensors`` knows it from a header."""
    shape = getattr(tensors, "shape", None)
    return tuple(shape(name)) if callable(shape) else tuple(tensors[name].shape)


def state_to_hf(
    family: Family,
    values: dict[str, Any],
    state: dict[str, Tensor],
    *,
    head: Mapping[str, str] = {},
) -> dict[str, Tensor]:
    """An attnlab ``state_dict`` as HF tensors (contiguous copies, ready to save).

    With a ``head``, encoder tensors get the family's base prefix. Layers that share
    weights (ALBERT) are written once.
    """
    names = hf_names(family, values, list(state), head)
    prefix = family.base_prefix if head else ""
    tensors: dict[str, Tensor] = {}
    for ours, theirs in names.items():
        parts = state[ours].chunk(3) if len(theirs) == 3 else (state[ours],)
        head_tensor = ours in head or _split(ours)[0] in head
        for name, part in zip(theirs, parts):
            full = name if head_tensor else prefix + name
            tensors.setdefault(full, part)
    return {name: tensor.detach().contiguous().clone() for name, tensor in tensors.items()}


def gather(tensors: Mapping[str, Tensor], plan: Plan) -> dict[str, Tensor]:
    """attnlab's tensors from a checkpoint's, through ``plan`` (names already checked):
    each HF tensor is looked up once, several are concatenated, transposed ones turned."""
    state = {}
    for names, ours, transposed in plan:
        parts = [tensors[name] for name in names]  # read here, one at a time
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts)  # q, k, v: [(H + 2K) * D, ...]
        state[ours] = tensor.t().contiguous() if transposed else tensor  # Conv1D [in, out] -> [out, in]
    return state


def scatter(state: Mapping[str, Tensor], plan: Plan, split: Callable[[Tensor], Sequence[Tensor]],
            prefix: str = "") -> dict[str, Tensor]:
    """A checkpoint's tensors from attnlab's, through ``plan``: the inverse of :func:`gather`
    (``split`` cuts a concatenated tensor back into its HF parts)."""
    tensors: dict[str, Tensor] = {}
    for names, ours, transposed in plan:
        tensor = state[ours].t() if transposed else state[ours]  # Linear [out, in] -> Conv1D [in, out]
        parts = split(tensor) if len(names) > 1 else (tensor,)
        tensors.update({prefix + name: part for name, part in zip(names, parts)})
    return tensors


def read_layout(tensors: Mapping[str, Tensor], plan: Plan, *, prefix: str, tie_embeddings: bool,
                ignored: tuple[str, ...] = (), source: str = "model.safetensors") -> dict[str, Tensor]:
    """A decoder's state dict from a checkpoint laid out as ``plan`` says (the LM head,
    ``lm_head.weight``, apart from the plan: present unless tied to the token embedding).

    Every name is checked before any tensor is looked up, and each is looked up once.

    Args:
        tensors: HF name -> tensor; the names may or may not start with ``prefix``.
        plan: the layout's table for the model's config, names without ``prefix``.
        prefix: the base model's prefix (``"model."``, ``"transformer."``).
        tie_embeddings: whether the LM head is the token embedding (a copy is then ignored).
        ignored: name endings that are skipped when present (old buffers).
        source: where the tensors came from, for messages.

    Raises:
        UnsupportedCheckpointError: missing or unexpected tensors, all listed.
    """
    prefix = prefix if any(name.startswith(prefix) for name in tensors) else ""
    remaining = set(tensors)
    missing: list[str] = []
    full: Plan = []
    for names, ours, transposed in plan:
        names = tuple(prefix + name for name in names)
        missing += [name for name in names if name not in remaining]
        remaining -= set(names)
        full.append((names, ours, transposed))
    has_head = _LM_HEAD in remaining  # a tied checkpoint may still hold a copy
    remaining.discard(_LM_HEAD)
    if not tie_embeddings:
        if has_head:
            full.append(((_LM_HEAD,), _LM_HEAD, False))
        else:
            missing.append(_LM_HEAD)
    unexpected = sorted(name for name in remaining if not (ignored and name.endswith(ignored)))
    if missing or unexpected:
        raise UnsupportedCheckpointError(f"{source}: missing tensors {missing}; unexpected tensors {unexpected}")
    return gather(tensors, full)


def write_layout(state: Mapping[str, Tensor], plan: Plan, *, prefix: str, tie_embeddings: bool,
                 split: Callable[[Tensor], Sequence[Tensor]]) -> dict[str, Tensor]:
    """A checkpoint's tensors (full HF names) from a decoder's state dict: the inverse of
    :func:`read_layout`; ``lm_head.weight`` only when the head is not tied."""
    tensors = scatter(state, plan, split, prefix)
    if not tie_embeddings:
        tensors[_LM_HEAD] = state[_LM_HEAD]
    return tensors
