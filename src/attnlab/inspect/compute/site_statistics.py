"""Statistics of every attention site, added as the weights are made: one recorder for both doors.

Dimension letters: ``B`` batch, ``H`` heads, ``t`` query rows of a block, ``T`` query rows
of the whole call, ``S`` key length.

attnlab's own models hand a layer's whole map as soon as it is made; a transformers model
served by attnlab's attention function hands blocks of query rows. Either way
:meth:`SiteStatistics.add` reduces them at once to the analyzer's sums
(:class:`~attnlab.inspect.compute.statistics.HeadStatistics`) and, on causal sites, to
the causal statistics (:class:`~attnlab.inspect.compute.causal_statistics.CausalStatistics`),
so no map is kept.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Optional

import torch
from torch import Tensor

from .causal_statistics import CausalStatistics
from .statistics import HeadStatistics

__all__ = ["SiteStatistics", "StreamingRollout", "add_states"]


def add_states(first: Any, second: Any) -> Any:
    """Two :meth:`SiteStatistics.state` (or any such nest of dicts, lists, tensors and
    numbers) added leaf by leaf: sums and counts add, ``broken`` flags combine, a key only
    one side has is kept (in the order of ``first``, then ``second``'s new keys)."""
    if first is None:
        return second
    if second is None:
        return first
    if isinstance(first, Mapping):
        joined = {key: add_states(value, second.get(key)) for key, value in first.items()}
        joined.update({key: value for key, value in second.items() if key not in first})
        return joined
    if isinstance(first, bool):
        return first or bool(second)
    if isinstance(first, (list, tuple)):
        return [add_states(a, b) for a, b in zip(first, second, strict=True)]
    return first + second


class StreamingRollout:
    """Attention rollout (:func:`~attnlab.inspect.attention_rollout`, head mean) summarised
    as the maps are made, one block of query rows at a time: only the rollout so far
    ``[B, T, T]`` is kept, never a layer's map, so memory is flat in the number of layers.

    ``R_l = A'_l R_{l-1}``: rows ``t`` of ``R_l`` need rows ``t`` of layer ``l``'s map and
    all of ``R_{l-1}``, which is complete when layer ``l`` runs. Each finished row adds its
    entropy over the real keys and the share kept by the token itself, as the analyzer
    reports them.
    """

    def __init__(self, layers: list[str], residual_weight: float = 0.5) -> None:
        if not 0.0 <= residual_weight <= 1.0:
            raise ValueError(f"residual_weight must lie in [0, 1], got {residual_weight!r}")
        self.layers, self.residual_weight = layers, residual_weight
        self._sums = {layer: [0.0, 0.0, 0.0] for layer in layers}
        self._previous: Optional[Tensor] = None  # R_{l-1} [B, T, T]
        self._current: Optional[Tensor] = None  # R_l, filled block by block
        self._expected = 0  # index of the layer whose rows come next
        self.broken = False  # maps that cannot be rolled out (not square, out of order)

    def add(self, layer: str, weights: Tensor, query_mask: Tensor, key_mask: Tensor, start: int, rows: int) -> None:
        if self.broken:
            return
        B, _, t, S = weights.shape
        index = self.layers.index(layer)
        if index == 0 and start == 0:  # a new forward
            self._previous, self._expected = torch.eye(S, device=weights.device).expand(B, S, S), 0
        if index != self._expected or S != rows or self._previous is None or self._previous.shape != (B, S, S):
            self.broken = True
            return
        if start == 0:
            self._current = torch.empty(B, S, S, device=weights.device)
        keys = key_mask.float()[:, None, :]  # [B, 1, S]
        mixed = weights.float().mean(1) * keys * query_mask.float()[:, :, None]  # [B, t, S]
        mixed = self.residual_weight * mixed
        diagonal = torch.arange(t, device=weights.device)
        mixed[:, diagonal, start + diagonal] += 1.0 - self.residual_weight  # the identity's rows, not an [S, S] eye
        mixed = mixed / mixed.sum(-1, keepdim=True).clamp_min(1e-12)
        block = mixed @ self._previous.to(weights.device)  # [B, t, S]; layers may run on different devices
        self._current[:, start:start + t] = block
        p = block * keys
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        entropy = -torch.special.xlogy(p, p).sum(-1)  # [B, t]
        own = p.diagonal(offset=start, dim1=-2, dim2=-1)  # [B, t]: row i's weight on key start + i
        real = query_mask.bool()
        sums = self._sums[layer]
        sums[0] += float(entropy[real].double().sum())
        sums[1] += float(own[real].double().sum())
        sums[2] += float(real.sum())
        if start + t == rows:
            self._previous, self._expected = self._current, index + 1

    def state(self) -> dict[str, Any]:
        """The sums behind :meth:`means` (between forwards), for :func:`add_states`."""
        return {"sums": {layer: list(sums) for layer, sums in self._sums.items()}, "broken": self.broken}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self._sums = {layer: list(sums) for layer, sums in state["sums"].items()}
        self.broken = bool(state["broken"])

    def means(self) -> Optional[dict[str, dict[str, float]]]:
        if self.broken:
            return None
        return {layer: {"entropy": e / n if n else math.nan, "self": s / n if n else math.nan}
                for layer, (e, s, n) in self._sums.items()}


class SiteStatistics:
    """Per-head statistics of attention sites, block by block (see the module docstring).

    Args:
        heads: keep only these heads (0-based); default all.
        sparsity_threshold, top_k, token_groups: as :class:`HeadStatistics`.

    Attributes:
        alignment: ``[B, T, S]`` bool of the batch being run, set by a caller that has one
            (the analyzer's batches may carry a reference alignment); ``None`` otherwise.
    """

    def __init__(self, *, heads: Optional[list[int]] = None, sparsity_threshold: float = 0.1, top_k: int = 3,
                 token_groups: Optional[Mapping[str, Collection[int]]] = None) -> None:
        self.options = {"sparsity_threshold": sparsity_threshold, "top_k": top_k, "token_groups": token_groups}
        self.heads = heads
        self.alignment: Optional[Tensor] = None
        self._rollout: Optional[StreamingRollout] = None
        self._window: Optional[int] = None
        self.clear()

    @property
    def window(self) -> Optional[int]:
        """The model's sliding window, set by the model whose statistics these are: causal
        layers then measure ``beyond_window`` (:mod:`~attnlab.inspect.compute.causal_statistics`)."""
        return self._window

    @window.setter
    def window(self, value: Optional[int]) -> None:
        self._window = self._causal.window = value

    def clear(self) -> None:
        """Forget what was added."""
        self._head = HeadStatistics(**self.options)
        self._causal = CausalStatistics(self._window)
        if self._rollout is not None:
            self._rollout = StreamingRollout(self._rollout.layers, self._rollout.residual_weight)

    def follow_rollout(self, layers: list[str], residual_weight: float = 0.5) -> None:
        """Also summarise the attention rollout through ``layers`` (one stack of
        self-attention layers, in the order the model runs them): :meth:`rollout_means`."""
        self._rollout = StreamingRollout(list(layers), residual_weight)

    def rollout_means(self) -> Optional[dict[str, dict[str, float]]]:
        """``{layer: {"entropy": .., "self": ..}}`` of the rollout after each layer, or
        ``None`` when it was not followed or the maps could not be rolled out."""
        return None if self._rollout is None else self._rollout.means()

    def add(self, name: str, weights: Tensor, query_mask: Tensor, key_mask: Tensor, *, causal: bool,
            input_ids: Optional[Tensor] = None, start: int = 0, rows: Optional[int] = None) -> None:
        """Add rows ``start .. start + t`` of one call of site ``name`` with ``rows`` query rows.

        Shape:
            ``weights`` ``[B, H, t, S]``; ``query_mask`` ``[B, t]`` and ``key_mask``
            ``[B, S]`` bool (``True`` on real tokens); ``input_ids`` ``[B, S]`` (the keys'
            ids, for the token groups) or ``None``.
        """
        rows = weights.shape[-2] if rows is None else rows
        kept = (weights if self.heads is None else weights[:, self.heads]).detach()
        alignment = self.alignment
        if alignment is not None:
            alignment = alignment[..., start:start + kept.shape[-2], :]
            if alignment.shape[-1] != kept.shape[-1]:
                alignment = None  # the batch's alignment is over other keys (cross-attention)
        self._head.update(name, kept, query_mask, key_mask, input_ids=input_ids, query_start=start,
                          alignment=alignment)
        if causal:
            S = kept.shape[-1]
            self._causal.update(name, kept, key_mask, first_query=S - rows + start)
        if self._rollout is not None and name in self._rollout.layers:
            self._rollout.add(name, kept, query_mask, key_mask, start, rows)

    def row_counts(self) -> dict[str, list[int]]:
        """``{layer: [query rows counted per head]}`` behind :meth:`means`."""
        return self._head.row_counts()

    def state(self) -> dict[str, Any]:
        """The sufficient statistics behind every mean (float64 sums and counts): saved, loaded
        (:meth:`load_state`) and added across processes (:func:`add_states`) exactly, never as
        means of means."""
        return {"head": self._head.state(), "causal": self._causal.state(),
                "rollout": None if self._rollout is None else self._rollout.state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state` (of a recorder with the same options and rollout)."""
        self._head.load_state(state["head"])
        self._causal.load_state(state["causal"])
        if self._rollout is not None and state.get("rollout") is not None:
            self._rollout.load_state(state["rollout"])

    def means(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{layer: {statistic: [one value per head]}}``: the analyzer's statistics (entropy,
        sparsity, top-k mass, mean distance, ...) over every key row, and, for causal layers,
        ``sink_mass`` and ``causal_normalized_entropy`` (entropy normalised by the allowed
        prefix; :meth:`causal_means` has the causal statistics apart)."""
        result: dict[str, Any] = self._head.means()
        causal = self.causal_means()
        for layer in result:
            if layer in causal["sink_mass"]:
                result[layer]["sink_mass"] = causal["sink_mass"][layer]
                result[layer]["causal_normalized_entropy"] = causal["normalized_entropy"][layer]
        return result

    def causal_means(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{statistic: {layer: [one value per head]}}`` of the causal layers: their
        :data:`~attnlab.inspect.compute.causal_statistics.CAUSAL_STATISTICS` over the allowed prefix."""
        return self._causal.means()
