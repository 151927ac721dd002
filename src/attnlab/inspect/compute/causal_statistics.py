"""Statistics that fit causal attention, per layer and head.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query rows, ``S`` keys.

A decoder's query at position ``t`` may attend only to the real keys at or before ``t``,
so a statistic that divides by the number of real keys of the whole sequence (as the
encoder statistics do) mixes up position and spread. Over each real query row ``p``,
with ``n_t`` the real keys it may attend (its allowed prefix):

* ``normalized_entropy``: ``-sum_s p_s log p_s / log n_t`` in ``[0, 1]`` (1 = uniform over
  the prefix); rows with ``n_t = 1`` (the first token) are left out.
* ``sink_mass``: the mass on the first real token, the "attention sink" of Xiao et al.
  (2023); rows with ``n_t = 1`` are left out (all their mass is there by force).
* ``mean_distance``: ``sum_s p_s (t - s)``, how far back the row looks, in real tokens.

Given a model's sliding window ``W`` (Mistral, Gemma 2 and 3, Qwen2: a local layer's query
sees only the keys ``s`` with ``t - s < W``, positions counted as the mask counts them), also

* ``beyond_window``: ``sum_{s <= t - W} p_s``, the mass on keys the window leaves out,
  over the rows with such keys (``t >= W``). A local layer gives exactly 0; a global layer
  of the same model shows how much it reads from beyond the window.

Values are means over rows, in float64.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["BEYOND_WINDOW", "CAUSAL_STATISTICS", "CausalStatistics", "causal_statistics", "describe_window"]

CAUSAL_STATISTICS = ("normalized_entropy", "sink_mass", "mean_distance")
BEYOND_WINDOW = "beyond_window"  # measured when a sliding window is given


def _beyond_window(weights: Tensor, keep: Tensor, first_query: int, window: int) -> tuple[Tensor, Tensor]:
    """Per-head sums ``[H]`` of the mass on keys at least ``window`` positions back, over the
    real query rows that have such keys, and those rows ``[H]``."""
    B, H, T, S = weights.shape
    queries = torch.arange(first_query, first_query + T, device=weights.device)
    far = queries[:, None] - torch.arange(S, device=weights.device)[None, :] >= window  # [T, S]
    mass = (weights.double() * (far[None, None] & keep[:, None, None, :])).sum(-1)  # [B, H, T]
    rows = (keep[:, first_query:first_query + T] & far.any(-1)[None, :]).double()  # [B, T]
    return (mass * rows[:, None, :]).sum((0, 2)), rows.sum().expand(H).clone()


def _layer_sums(weights: Tensor, keep: Tensor, first_query: int) -> tuple[dict[str, Tensor], Tensor]:
    """Per-head sums over counted rows ``{statistic: [H]}`` and the rows counted ``[H]``
    (the ``T`` rows are the queries at positions ``first_query .. first_query + T - 1``)."""
    B, H, T, S = weights.shape
    queries = slice(first_query, first_query + T)
    p = weights.double() * keep[:, None, None, :]  # [B, H, T, S], padding keys dropped
    real_before = keep.long().cumsum(-1)  # [B, S] real tokens up to and including s
    rank = real_before - 1  # [B, S] index of a real token among the real ones
    query_rank = rank[:, queries]  # [B, T]
    prefix = real_before[:, queries].double()  # [B, T] n_t
    rows = keep[:, queries] & (prefix > 1)  # [B, T] real queries with a choice
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [B, H, T]
    normalized = entropy / prefix.clamp_min(2).log()[:, None]
    first = (keep & (rank == 0)).double()  # [B, S] the first real token
    sink = (p * first[:, None, None, :]).sum(-1)  # [B, H, T]
    distance = (p * (query_rank[:, None, :, None] - rank[:, None, None, :]).double()).sum(-1)  # [B, H, T]
    weight = rows[:, None, :].double().expand(B, H, T)  # [B, H, T]
    sums = {name: (value * weight).sum((0, 2)) for name, value in
            (("normalized_entropy", normalized), ("sink_mass", sink), ("mean_distance", distance))}
    return sums, weight.sum((0, 2))


class CausalStatistics:
    """Streaming means of the causal statistics per layer and head, batch by batch
    (sums in float64: any split of the data into batches gives the same result).

    Example:
        >>> stats = CausalStatistics()
        >>> stats.update("layer_1", weights, attention_mask)
        >>> stats.means()["sink_mass"]["layer_1"]   # one float per head
    """

    def __init__(self, window: Optional[int] = None) -> None:
        self.window = window  # the model's sliding window: measure beyond_window too
        self._sums: dict[str, dict[str, Tensor]] = {}
        self._rows: dict[str, Tensor] = {}
        self._window_rows: dict[str, Tensor] = {}

    def update(
        self, layer: str, weights: Tensor, attention_mask: Optional[Tensor] = None, *,
        first_query: Optional[int] = None,
    ) -> None:
        """Add one batch of one layer.

        Args:
            first_query: the position of the first query row; default ``S - T`` (the
                rows are the last ``T`` positions). A block of rows of a longer map is
                added with its own start.

        Shape:
            ``weights`` ``[B, H, T, S]``;
            ``attention_mask`` ``[B, S]``, ``True`` / 1 on real tokens (``None``: all real).
        """
        if not isinstance(weights, Tensor) or weights.dim() != 4:
            raise ValueError(f"{layer}: weights must be [B, H, T, S], got {getattr(weights, 'shape', weights)}")
        B, _, T, S = weights.shape
        first_query = S - T if first_query is None else first_query
        if not 0 <= first_query <= S - T:
            raise ValueError(f"{layer}: first_query must lie in 0..{S - T} for {T} rows of {S} keys, got {first_query}")
        if attention_mask is None:
            keep = torch.ones(B, S, dtype=torch.bool, device=weights.device)
        else:
            if tuple(attention_mask.shape) != (B, S):
                raise ValueError(f"attention_mask must be [B, S] = [{B}, {S}], got {tuple(attention_mask.shape)}")
            keep = attention_mask.bool().to(weights.device)
        sums, rows = _layer_sums(weights, keep, first_query)
        window_rows = None
        if self.window is not None:
            sums[BEYOND_WINDOW], window_rows = _beyond_window(weights, keep, first_query, self.window)
        if layer in self._sums:
            for name, value in sums.items():
                self._sums[layer][name] = self._sums[layer][name] + value if name in self._sums[layer] else value
            self._rows[layer] += rows
        else:
            self._sums[layer], self._rows[layer] = sums, rows
        if window_rows is not None:
            self._window_rows[layer] = self._window_rows.get(layer, 0) + window_rows

    def state(self) -> dict[str, Any]:
        """The float64 sums and row counts behind :meth:`means` (copies)."""
        return {"sums": {layer: {name: value.clone() for name, value in sums.items()}
                         for layer, sums in self._sums.items()},
                "rows": {layer: rows.clone() for layer, rows in self._rows.items()},
                "window_rows": {layer: rows.clone() for layer, rows in self._window_rows.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self._sums = {layer: {name: value.clone() for name, value in sums.items()}
                      for layer, sums in state["sums"].items()}
        self._rows = {layer: rows.clone() for layer, rows in state["rows"].items()}
        self._window_rows = {layer: rows.clone() for layer, rows in state.get("window_rows", {}).items()}

    def means(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{statistic: {layer: [one value per head, None where no row counted]}}``
        (``beyond_window`` too when a window was given)."""
        names = CAUSAL_STATISTICS + ((BEYOND_WINDOW,) if self._window_rows else ())
        result: dict[str, dict[str, list[Optional[float]]]] = {name: {} for name in names}
        for layer, sums in self._sums.items():
            for name in names:
                rows = self._window_rows.get(layer) if name == BEYOND_WINDOW else self._rows[layer]
                if rows is None or name not in sums:
                    continue
                result[name][layer] = [None if count == 0 else float(total / count)
                                       for total, count in zip(sums[name].tolist(), rows.tolist())]
        return result


def causal_statistics(
    attentions: Mapping[str, Tensor], attention_mask: Optional[Tensor] = None, *, window: Optional[int] = None,
) -> dict[str, dict[str, list[Optional[float]]]]:
    """``{statistic: {layer name: [one value per head]}}`` of a decoder's weights.

    Args:
        attentions: ``{"layer_1": [B, H, T, S], ...}`` (a
            :class:`~attnlab.outputs.LayerAttentions` works), the ``T`` rows being the
            last ``T`` of the ``S`` positions.
        attention_mask: ``[B, S]`` keep mask, ``True`` / 1 on real tokens (left or right
            padding); ``None`` = all real.
        window: the model's sliding window: ``beyond_window`` is measured too.

    Example:
        >>> out = model(ids, output_attentions=True)
        >>> causal_statistics(out.attentions)["sink_mass"]["layer_1"]
        [0.61, 0.08, ...]
    """
    items = list(attentions.items())
    if not items:
        raise ValueError("attentions is empty: pass {layer name: [B, H, T, S] weights}")
    statistics = CausalStatistics(window)
    for layer, weights in items:
        statistics.update(layer, weights, attention_mask)
    return statistics.means()


def _spans(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def describe_window(beyond: Mapping[str, list[Optional[float]]], window: int) -> str:
    """One line on what each layer reads beyond the sliding window, from ``beyond_window``
    (``{layer_k: [per head]}``): the layers that read exactly nothing there (local) and
    the others, with their range of head means."""
    measured = {int(layer.rsplit("_", 1)[-1]): [v for v in values if v is not None]
                for layer, values in beyond.items() if layer.startswith("layer_")}
    measured = {layer: values for layer, values in measured.items() if values}
    if not measured:
        return (f"sliding window {window}: no text is longer than the window, so what layers read beyond it "
                f"was not measured (give texts of more than {window} tokens)")
    local = sorted(layer for layer, values in measured.items() if max(values) == 0.0)
    wide = sorted(layer for layer in measured if layer not in local)
    parts = []
    if local:
        parts.append(f"layer{'s' if len(local) > 1 else ''} {_spans(local)} put exactly 0 beyond it")
    if wide:
        values = [value for layer in wide for value in measured[layer]]
        parts.append(f"layer{'s' if len(wide) > 1 else ''} {_spans(wide)} put {min(values):.3g}-{max(values):.3g} "
                     f"of each row there (head means)")
    return f"sliding window {window} tokens: " + "; ".join(parts)
