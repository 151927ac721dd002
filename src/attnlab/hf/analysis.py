"""A data set's attention statistics on a transformers model, without keeping the maps.

:class:`~attnlab.inspect.AttentionAnalyzer` serves every model through the inspection
protocol; on a transformers model (a :class:`~attnlab.hf.opening.TransformersModel`, or a
raw one, wrapped) its statistics are computed by :func:`~attnlab.hf.attach` in statistics
mode: each layer's weights are reduced block by block of query rows as the layer runs, so
a long input on a large model never holds one layer's ``[B, H, T, S]``.

An encoder-decoder (T5, BART, Marian) reads each text as its source *and* as its target
(:data:`~attnlab.hf.opening.DECODER_INPUT`, said in the settings).
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Optional

from torch import nn

from ..inspect.compute.analyzer import AttentionAnalyzer, AttentionStatistics
from .opening import DECODER_INPUT

__all__ = ["DECODER_INPUT", "analyze_transformers"]


def analyze_transformers(
    model: nn.Module,
    dataloader: Iterable[Any],
    *,
    pad_id: Optional[int] = None,
    sparsity_threshold: float = 0.1,
    top_k: int = 3,
    token_groups: Optional[Mapping[str, Collection[int]]] = None,
    head_mask: Optional[Mapping[str, Iterable[int]]] = None,
) -> AttentionStatistics:
    """Per-layer, per-head statistics of a transformers model over every batch: the
    analyzer's (:meth:`~attnlab.inspect.AttentionAnalyzer.analyze_attention_distribution`).

    Args:
        model: a transformers model, or a :class:`~attnlab.hf.opening.TransformersModel`.
        dataloader: batches as :class:`~attnlab.inspect.AttentionAnalyzer` takes them.
        pad_id: padding id for batches without a mask.
        sparsity_threshold, top_k, token_groups: as the analyzer's.
        head_mask: heads to switch off, ``{"layer_k": [heads]}`` (0-based).
    """
    analyzer = AttentionAnalyzer(model, pad_id=pad_id, sparsity_threshold=sparsity_threshold, top_k=top_k,
                                 token_groups=token_groups)
    return analyzer.analyze_attention_distribution(dataloader, head_mask=head_mask)
