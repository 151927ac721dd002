"""Attention flow (Abnar & Zuidema, 2020): max-flow through the layered attention graph.

Dimension letters: ``L`` layers, ``B`` batch, ``H`` heads, ``T`` length.

The graph has a node per (layer boundary, position): ``(0, s)`` are the input tokens,
``(l, t)`` the outputs of layer ``l``. Layer ``l`` joins ``(l - 1, s)`` to ``(l, t)``
by an edge of capacity ``A'_l[t, s]``, where ``A'_l`` is the head-mean attention mixed
with the identity for the residual and renormalised, exactly as in rollout. A sink
node is fed by every ``(L, t)`` with capacity ``w_t``, the query's weight in the
pooled position (one-hot on ``[CLS]``, uniform for mean pooling, one-hot on the last
real token of a causal decoder). A token's score
is the maximum flow from ``(0, s)`` to the sink. Where rollout multiplies paths,
flow takes the bottleneck of the best set of paths, so it is not linear in the
attention.

Max-flow runs in :func:`scipy.sparse.csgraph.maximum_flow` (Dinic) on integer
capacities: the weights are scaled by ``2**24`` and rounded, an error below
``L * T * 2**-24`` per score.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .attention_scores import Attentions, as_layer_list

__all__ = ["attention_flow", "flow_graph", "SCALE"]

SCALE = 2**24  # capacities are integers: weights times SCALE, rounded


def _mixed_layers(layers: list[Tensor], mask: Optional[Tensor], residual_weight: float) -> Tensor:
    """``[L, B, T, T]`` head-mean attention mixed with the identity, rows summing to 1."""
    B, _, T, _ = layers[0].shape
    eye = torch.eye(T, dtype=torch.float64)
    keep = None if mask is None else mask.bool().cpu()[:, None, :].double()  # [B, 1, T]
    mixed = []
    for weights in layers:
        mean = weights.detach().double().cpu().mean(1)  # [B, T, T]
        if keep is not None:
            mean = mean * keep * keep.transpose(1, 2)
        mean = residual_weight * mean + (1.0 - residual_weight) * eye
        if keep is not None:
            mean = mean * keep * keep.transpose(1, 2)  # padded positions join nothing
        mixed.append(mean / mean.sum(-1, keepdim=True).clamp_min(1e-12))
    return torch.stack(mixed)  # [L, B, T, T]


def flow_graph(mixed: np.ndarray, query_weights: np.ndarray):
    """The layered graph of one example as a CSR matrix of integer capacities.

    Args:
        mixed: ``[L, T, T]`` residual-mixed attention (row ``t`` = query, column ``s`` = key).
        query_weights: ``[T]`` capacity of each last-layer node into the sink.

    Returns:
        ``(graph, sink)``: a ``scipy.sparse.csr_array`` over ``(L + 1) * T + 1`` nodes
        (node ``l * T + t``; the sink last) and the sink's index.
    """
    from scipy.sparse import csr_array

    L, T, _ = mixed.shape
    sink = (L + 1) * T
    rows, cols, capacities = [], [], []
    for layer in range(L):
        t, s = np.nonzero(mixed[layer] > 0)
        rows.append(layer * T + s)  # from (layer, key s) ...
        cols.append((layer + 1) * T + t)  # ... to (layer + 1, query t)
        capacities.append(mixed[layer][t, s])
    t = np.nonzero(query_weights > 0)[0]
    rows.append(L * T + t)
    cols.append(np.full(t.shape, sink))
    capacities.append(query_weights[t])
    data = np.round(np.concatenate(capacities) * SCALE).astype(np.int32)
    graph = csr_array(
        (data, (np.concatenate(rows).astype(np.int32), np.concatenate(cols).astype(np.int32))),
        shape=(sink + 1, sink + 1),
    )
    return graph, sink


def attention_flow(
    attentions: Attentions,
    query_weights: Tensor,
    mask: Optional[Tensor] = None,
    *,
    residual_weight: float = 0.5,
) -> Tensor:
    """Maximum flow from every input token to the pooled position of the last layer.

    Args:
        attentions: per layer ``[B, H, T, T]`` (a list or the ``{"layer_1": ...}`` mapping).
        query_weights: ``[B, T]`` weight of each last-layer position in the pooled one
            (:func:`~attnlab.inspect.compute.attribution_target.query_weights`).
        mask: ``[B, T]`` bool, ``True`` on real tokens; padded positions carry no flow.
        residual_weight: the attention's share against the residual (0.5 in the paper).

    Returns:
        ``[B, T]`` float flows (each at most the pooled row's total weight, 1).

    Raises:
        ImportError: scipy is missing (``pip install 'attnlab[explain]'``).
    """
    try:
        from scipy.sparse.csgraph import maximum_flow
    except ImportError as error:  # pragma: no cover - the explain extra installs it
        raise ImportError("attention flow needs scipy: pip install 'attnlab[explain]'") from error
    layers = as_layer_list(attentions)
    if not 0.0 <= residual_weight <= 1.0:
        raise ValueError(f"residual_weight must lie in [0, 1], got {residual_weight!r}")
    B, _, T, _ = layers[0].shape
    if query_weights.shape != (B, T):
        raise ValueError(f"query_weights must be [B, T] = [{B}, {T}], got {tuple(query_weights.shape)}")
    mixed = _mixed_layers(layers, mask, residual_weight).numpy()  # [L, B, T, T]
    pooled = query_weights.detach().double().cpu().numpy()
    if mask is not None:
        pooled = pooled * mask.bool().cpu().numpy()
    flows = np.zeros((B, T))
    for b in range(B):
        graph, sink = flow_graph(mixed[:, b], pooled[b])
        for s in range(T):
            if mask is not None and not bool(mask[b, s]):
                continue
            flows[b, s] = maximum_flow(graph, s, sink).flow_value / SCALE
    return torch.from_numpy(flows).float()  # [B, T]
