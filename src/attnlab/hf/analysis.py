"""A data set's attention statistics on a transformers model, without keeping the maps.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` query length, ``S`` key length.

What :class:`~attnlab.inspect.AttentionAnalyzer` gives attnlab's models, computed by
:func:`~attnlab.hf.attach` in statistics mode: each layer's weights are reduced to the
statistics block by block of query rows as the layer runs, so a long input on a large
model never holds one layer's ``[B, H, T, S]``, let alone every layer's.

An encoder-decoder (T5, BART, Marian) reads each text as its source *and* as its target:
the decoder gets the text shifted right after its start token (teacher forcing, as BART
does by itself when given no decoder input), so the ``decoder.`` and ``cross.`` statistics
describe the model reconstructing the text; :data:`DECODER_INPUT` says so in the settings.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Optional

import torch
from torch import nn

from ..inspect.compute.analyzer import AttentionStatistics
from ..inspect.compute.batches import as_analysis_batch
from .backend import attach
from .seq2seq import _is_seq2seq, decoder_start

__all__ = ["DECODER_INPUT", "analyze_transformers"]

DECODER_INPUT = ("each text itself, shifted right after the decoder start token (teacher forcing): the decoder "
                 "and cross statistics describe the model reading the text as its own target")


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
    """Per-layer, per-head statistics of a transformers model over every batch.

    Args:
        model: a transformers model, or a :class:`~attnlab.hf.opening.TransformersModel`.
        dataloader: batches as :class:`~attnlab.inspect.AttentionAnalyzer` takes them.
        pad_id: padding id for batches without a mask.
        sparsity_threshold, top_k, token_groups: as the analyzer's.
        head_mask: heads to switch off, ``{"layer_k": [heads]}`` (0-based).

    Returns:
        :class:`~attnlab.inspect.AttentionStatistics` (no rollout: it needs every map).
    """
    hf_model = getattr(model, "model", model)
    start = decoder_start(hf_model) if _is_seq2seq(hf_model) else None
    examples = tokens = 0
    with torch.no_grad(), attach(
        hf_model, layers="all", statistics=True, head_mask=head_mask, sparsity_threshold=sparsity_threshold,
        top_k=top_k, token_groups=token_groups,
    ) as seen:
        for batch in dataloader:
            normalised = as_analysis_batch(batch, pad_id)
            mask = normalised.mask.long()
            decoder = {}
            if start is not None:  # the text as its own target, shifted right
                ids = normalised.input_ids
                decoder = {"decoder_input_ids": torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], 1),
                           "decoder_attention_mask": torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], 1)}
            hf_model(input_ids=normalised.input_ids, attention_mask=mask, **decoder)
            examples += normalised.input_ids.shape[0]
            tokens += int(normalised.mask.sum())
    if examples == 0:
        raise ValueError("dataloader yielded no batch")
    means = seen.statistics()
    layers = list(means)
    names = list(dict.fromkeys(name for layer in layers for name in means[layer]))
    table = {name: {layer: means[layer].get(name, [None] * len(means[layer]["entropy"])) for layer in layers}
             for name in names}
    return AttentionStatistics(
        layers=layers,
        num_heads=[len(means[layer]["entropy"]) for layer in layers],
        statistics=table,
        rows=seen.row_counts(),
        rollout=None,
        examples=examples,
        tokens=tokens,
        settings={
            "sparsity_threshold": sparsity_threshold, "top_k": top_k, "pad_id": pad_id,
            "token_groups": {name: sorted(map(int, ids)) for name, ids in (token_groups or {}).items()},
            "path": "transformers, statistics computed block by block inside attnlab's attention function",
            "head_mask": {name: list(heads) for name, heads in (head_mask or {}).items()} or None,
            **({"decoder_input": DECODER_INPUT} if start is not None else {}),
        },
    )
