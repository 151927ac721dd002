"""Per-head attention statistics, accumulated batch by batch.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length.

Every statistic is a number per *query row* ``p = weights[b, h, t, :]``, averaged over
the rows of real queries. Padding is excluded: rows of padded queries are skipped, keys
at padded positions are dropped and the row is renormalised over the ``n`` real keys
(a no-op when the model masked its padding, as attnlab models do). A row with no mass on
real keys is skipped.

With ``p`` the renormalised row, ``n`` its number of real keys and ``t`` its position:

* ``entropy``: ``-sum_s p_s log p_s`` (natural log; ``0 log 0 = 0``).
* ``normalized_entropy``: ``entropy / log n`` in ``[0, 1]`` (1 = uniform); ``0`` when ``n = 1``.
* ``sparsity``: fraction of real keys with ``p_s < threshold``.
* ``top_k_mass``: sum of the ``k`` largest ``p_s`` (1 when ``n <= k``).
* ``gini``: Gini coefficient of ``p`` over the real keys,
  ``sum_i (2i - n - 1) p_(i) / n`` with ``p_(1) <= ... <= p_(n)``; 0 = uniform,
  ``(n - 1) / n`` = one-hot.
* ``alignment_score``: attention mass on the reference keys, ``sum_s p_s R_ts``, where
  ``R`` is the boolean reference alignment ``[T, S]`` of the example restricted to real
  keys. Averaged over the rows that have at least one reference key. 1 = every bit of
  attention lies on the reference; uniform attention scores ``|R_t| / n``. Default
  reference (no ``alignment`` in the batch): the previous/next-token band
  ``R_ts = (|s - t| == 1)``.
* ``alignment_argmax``: over the same rows, how often the most attended key is a
  reference key.
* ``mass_<group>``: attention mass on keys whose token id is in the group (for example
  ``cls``, ``sep``, ``punct``); needs ``T == S`` (self-attention).
* ``mean_offset``: ``sum_s p_s (s - t)``, the signed mean attended offset (negative =
  looks back); ``mean_distance``: ``sum_s p_s |s - t|``.

Sums are kept in float64 per head, so memory does not grow with the data and splitting
the data into batches differently gives the same result.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["HeadStatistics", "row_statistics", "neighbour_alignment", "BASE_STATISTICS"]

BASE_STATISTICS = (
    "entropy",
    "normalized_entropy",
    "sparsity",
    "top_k_mass",
    "gini",
    "mean_offset",
    "mean_distance",
)
ALIGNMENT_STATISTICS = ("alignment_score", "alignment_argmax")


def neighbour_alignment(T: int, S: int, device=None, *, query_start: int = 0) -> Tensor:
    """Default reference alignment: ``True`` where ``|s - t| == 1``; ``[T, S]`` bool.

    ``query_start`` is the position of the first query row (for a block of rows).
    """
    queries = torch.arange(query_start, query_start + T, device=device)[:, None]  # [T, 1]
    offsets = torch.arange(S, device=device)[None, :] - queries  # [T, S]
    return offsets.abs() == 1


def row_statistics(
    weights: Tensor,
    query_mask: Tensor,
    key_mask: Tensor,
    *,
    sparsity_threshold: float = 0.1,
    top_k: int = 3,
    alignment: Optional[Tensor] = None,
    key_groups: Optional[Mapping[str, Tensor]] = None,
    query_start: int = 0,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Every statistic for every query row of one batch (see the module docstring).

    Args:
        weights: attention probabilities.
        query_mask: ``True`` on real queries.
        key_mask: ``True`` on real keys.
        sparsity_threshold: a key counts as unattended below this weight.
        top_k: how many of the largest weights ``top_k_mass`` adds up.
        alignment: reference alignment (``True`` = query ``t`` aligns with key ``s``);
            default the previous/next-token band.
        key_groups: ``{name: [B, S] bool}``, keys that belong to each token group.
        query_start: position of the first query row, when ``weights`` holds a block of
            rows ``query_start .. query_start + T - 1`` (the alignment then covers those rows).

    Returns:
        ``(values, rows)``: ``values[name]`` ``[B, H, T]`` per-row statistics and
        ``rows[name]`` ``[B, H, T]`` bool, the rows that count for that statistic.

    Shape:
        ``weights`` ``[B, H, T, S]``, ``query_mask`` ``[B, T]``, ``key_mask`` ``[B, S]``,
        ``alignment`` ``[B, T, S]`` or ``[T, S]``, each group ``[B, S]``.
    """
    B, H, T, S = weights.shape
    valid_keys = key_mask[:, None, None, :]  # [B, 1, 1, S]
    p = weights.float() * valid_keys  # [B, H, T, S]
    row_mass = p.sum(-1, keepdim=True)  # [B, H, T, 1]
    counted = query_mask[:, None, :] & (row_mass[..., 0] > 0)  # [B, H, T]
    p.div_(row_mass.clamp_min(torch.finfo(p.dtype).tiny))
    n = key_mask.sum(-1).view(B, 1, 1).float()  # [B, 1, 1] real keys per example
    positions = torch.arange(S, device=p.device, dtype=p.dtype)  # [S]
    queries = torch.arange(query_start, query_start + T, device=p.device, dtype=p.dtype)[:, None]  # [T, 1]

    # Padded keys hold 0 and every weight is >= 0, so after an ascending sort the real
    # keys' weights fill the last n places: rank r (1-based) is rank r - (S - n) among them.
    ordered = p.sort(dim=-1).values  # [B, H, T, S]
    ranks = positions + 1
    gini_coefficients = (2 * ranks - 2 * S + n[..., None] - 1) / n[..., None].clamp_min(1)  # [B, 1, 1, S]
    entropy = -torch.special.xlogy(p, p).sum(-1)  # [B, H, T]
    log_n = n.log()  # [B, 1, 1]
    values = {
        "entropy": entropy,
        "normalized_entropy": torch.where(
            log_n > 0, entropy / log_n.clamp_min(1e-12), torch.zeros_like(entropy)
        ),
        # padded keys (weight 0) are always below the threshold: take them back out
        "sparsity": ((p < sparsity_threshold).sum(-1) - (S - n)) / n.clamp_min(1),
        "top_k_mass": ordered[..., -min(top_k, S) :].sum(-1),
        "gini": (ordered * gini_coefficients).sum(-1),
        "mean_offset": p @ positions - queries[:, 0],  # rows sum to 1: sum_s p_s (s - t)
        "mean_distance": (p * (positions - queries).abs()).sum(-1),  # |s - t| is [T, S]
    }
    del ordered
    rows = {name: counted for name in values}

    if alignment is None:
        reference = neighbour_alignment(T, S, p.device, query_start=query_start)[None] & key_mask[:, None, :]
    else:
        reference = alignment.bool().to(p.device).expand(B, T, S) & key_mask[:, None, :]  # [B, T, S]
    if alignment is None and T == S and query_start == 0:  # the band is two diagonals: no product needed
        previous = F.pad(p.diagonal(offset=-1, dim1=-2, dim2=-1), (1, 0))  # [B, H, T]: p[t, t-1]
        following = F.pad(p.diagonal(offset=1, dim1=-2, dim2=-1), (0, 1))  # [B, H, T]: p[t, t+1]
        values["alignment_score"] = previous + following
    else:
        values["alignment_score"] = (p * reference[:, None]).sum(-1)
    has_reference = counted & reference.any(-1)[:, None, :]  # [B, H, T]
    values["alignment_argmax"] = (
        reference[:, None].expand(B, H, T, S).gather(-1, p.argmax(-1, keepdim=True))[..., 0].float()
    )
    rows["alignment_score"] = rows["alignment_argmax"] = has_reference

    if key_groups:
        names = list(key_groups)
        members = torch.stack([key_groups[name] & key_mask for name in names], -1).to(p.dtype)  # [B, S, G]
        masses = p @ members[:, None]  # [B, H, T, G]
        for index, name in enumerate(names):
            values[f"mass_{name}"] = masses[..., index]
            rows[f"mass_{name}"] = counted
    return values, rows


class HeadStatistics:
    """Streaming means of :func:`row_statistics` per layer and head.

    Args:
        sparsity_threshold: weight below which a key counts as unattended.
        top_k: number of largest weights in ``top_k_mass``.
        token_groups: ``{name: token ids}``; adds ``mass_<name>`` (e.g. ``{"cls": [101]}``).
        chunk_cells: most attention weights handled at once (blocks of examples, and of
            query rows for long inputs), which bounds the temporaries; the result does
            not depend on it.

    Example:
        >>> stats = HeadStatistics()
        >>> stats.update("layer_1", weights, mask, mask, input_ids=ids)
        >>> stats.means()["layer_1"]["entropy"]   # one float per head
    """

    def __init__(
        self,
        *,
        sparsity_threshold: float = 0.1,
        top_k: int = 3,
        token_groups: Optional[Mapping[str, Collection[int]]] = None,
        chunk_cells: int = 1 << 20,
    ) -> None:
        if (
            isinstance(sparsity_threshold, bool)
            or not isinstance(sparsity_threshold, (int, float))
            or not 0.0 < sparsity_threshold <= 1.0
        ):
            raise ValueError(f"sparsity_threshold must be a float in (0, 1], got {sparsity_threshold!r}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        if isinstance(chunk_cells, bool) or not isinstance(chunk_cells, int) or chunk_cells < 1:
            raise ValueError(f"chunk_cells must be a positive int, got {chunk_cells!r}")
        self.chunk_cells = chunk_cells
        self.sparsity_threshold = float(sparsity_threshold)
        self.top_k = top_k
        self.token_groups = {
            name: sorted(set(int(i) for i in ids)) for name, ids in (token_groups or {}).items()
        }
        self._sums: dict[str, dict[str, Tensor]] = {}
        self._rows: dict[str, dict[str, Tensor]] = {}

    def _group_masks(self, input_ids: Optional[Tensor]) -> dict[str, Tensor]:
        if not self.token_groups or input_ids is None:
            return {}
        return {
            name: torch.isin(input_ids, torch.tensor(ids, dtype=input_ids.dtype, device=input_ids.device))
            for name, ids in self.token_groups.items()
        }

    def update(
        self,
        layer: Union[str, Sequence[str]],
        weights: Tensor,
        query_mask: Tensor,
        key_mask: Tensor,
        *,
        alignment: Optional[Tensor] = None,
        input_ids: Optional[Tensor] = None,
        query_start: int = 0,
    ) -> None:
        """Add one batch of one layer, or of several layers at once.

        Several layers of one batch (``layer`` a list of names, ``weights`` stacked) go
        through one set of tensor operations instead of one set per layer. A block of
        query rows ``query_start .. query_start + T - 1`` of longer maps can be added on
        its own (``query_mask`` and ``alignment`` then cover those rows): blocks of rows
        added one by one give the same means as the whole maps.

        Shape:
            ``weights`` ``[B, H, T, S]`` (or ``[L, B, H, T, S]`` with ``L`` names);
            ``query_mask`` ``[B, T]`` and ``key_mask`` ``[B, S]`` bool (``True`` on real
            tokens); ``alignment`` ``[B, T, S]`` bool; ``input_ids`` ``[B, S]`` (the
            keys' ids, for the token groups).
        """
        names = [layer] if isinstance(layer, str) else list(layer)
        if weights.dim() == 4 and isinstance(layer, str):
            weights = weights[None]  # [1, B, H, T, S]
        if weights.dim() != 5 or weights.shape[0] != len(names):
            raise ValueError(
                f"weights must be [B, H, T, S] for one layer or [L, B, H, T, S] for L = {len(names)} layers, "
                f"got shape {tuple(weights.shape)}"
            )
        L, B, H, T, S = weights.shape
        if query_mask.shape != (B, T) or key_mask.shape != (B, S):
            raise ValueError(
                f"query_mask must be [B, T] = [{B}, {T}] and key_mask [B, S] = [{B}, {S}], "
                f"got {tuple(query_mask.shape)} and {tuple(key_mask.shape)}"
            )
        groups = self._group_masks(input_ids) if input_ids is not None and input_ids.shape == (B, S) else {}
        flat = weights.reshape(L * B, H, T, S)  # layers side by side in the batch dimension
        query_mask, key_mask = query_mask.bool().repeat(L, 1), key_mask.bool().repeat(L, 1)
        if alignment is not None:
            alignment = alignment.bool().expand(B, T, S).repeat(L, 1, 1)  # [L * B, T, S]
        groups = {name: members.repeat(L, 1) for name, members in groups.items()}
        # blocks of examples, or of query rows when one example alone is too large
        rows_per_block = max(1, min(T, self.chunk_cells // (H * S)))
        examples_per_block = max(1, self.chunk_cells // (H * T * S)) if rows_per_block == T else 1
        totals = counts = None
        for first in range(0, L * B, examples_per_block):
            block = slice(first, first + examples_per_block)
            for start in range(0, T, rows_per_block):
                queries = slice(start, start + rows_per_block)
                values, rows = row_statistics(
                    flat[block, :, queries],
                    query_mask[block, queries],
                    key_mask[block],
                    sparsity_threshold=self.sparsity_threshold,
                    top_k=self.top_k,
                    alignment=None if alignment is None else alignment[block, queries],
                    key_groups={name: members[block] for name, members in groups.items()},
                    query_start=query_start + start,
                )
                statistics = list(values)
                stacked = torch.stack([values[name] for name in statistics])  # [N, b, H, t]
                counted = torch.stack([rows[name] for name in statistics])
                layer_of = torch.arange(first, first + stacked.shape[1], device=stacked.device) // B  # [b]
                block_totals = torch.zeros(len(statistics), L, H, dtype=torch.float64, device=stacked.device)
                block_counts = torch.zeros_like(block_totals)
                block_totals.index_add_(1, layer_of, torch.where(counted, stacked, 0.0).sum(-1).double())
                block_counts.index_add_(1, layer_of, counted.sum(-1).double())
                totals = block_totals if totals is None else totals + block_totals
                counts = block_counts if counts is None else counts + block_counts
        totals, counts = totals.cpu(), counts.cpu()  # [N, L, H]
        for index, name in enumerate(names):
            sums = self._sums.setdefault(name, {})
            numbers = self._rows.setdefault(name, {})
            for position, statistic in enumerate(statistics):
                total, count = totals[position, index], counts[position, index]
                sums[statistic] = sums[statistic] + total if statistic in sums else total
                numbers[statistic] = numbers[statistic] + count if statistic in numbers else count

    @property
    def layers(self) -> list[str]:
        return list(self._sums)

    def state(self) -> dict[str, Any]:
        """The float64 sums and row counts behind :meth:`means` (copies)."""
        return {"sums": {layer: {name: value.clone() for name, value in sums.items()}
                         for layer, sums in self._sums.items()},
                "rows": {layer: {name: value.clone() for name, value in rows.items()}
                         for layer, rows in self._rows.items()}}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self._sums = {layer: {name: value.clone() for name, value in sums.items()}
                      for layer, sums in state["sums"].items()}
        self._rows = {layer: {name: value.clone() for name, value in rows.items()}
                      for layer, rows in state["rows"].items()}

    def means(self) -> dict[str, dict[str, list[Optional[float]]]]:
        """``{layer: {statistic: [one value per head]}}``; ``None`` where no row counted."""
        result: dict[str, dict[str, list[Optional[float]]]] = {}
        for layer, sums in self._sums.items():
            result[layer] = {}
            for name, total in sums.items():
                count = self._rows[layer][name]
                result[layer][name] = [
                    float(s / c) if c > 0 else None for s, c in zip(total.tolist(), count.tolist())
                ]
        return result

    def row_counts(self) -> dict[str, list[int]]:
        """``{layer: [rows counted per head]}`` for the base statistics."""
        return {layer: [int(c) for c in rows["entropy"].tolist()] for layer, rows in self._rows.items()}
