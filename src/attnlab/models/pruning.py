"""Remove attention heads for good (Michel et al., 2019; HuggingFace's old ``prune_heads``).

Dimension letters: ``H`` heads, ``D`` head dim, ``E`` model dim.

:func:`prune_heads` shrinks each named layer's Q, K, V and output projections to the
heads that remain (``[3 * H' * D, E]`` and ``[E, H' * D]``), so a pruned model computes
what the full model computes with those heads' outputs zeroed, in less time and memory.
The removed heads are recorded in the encoder's config (``pruned_heads``), so
``save_pretrained`` / ``attnlab.load`` give the pruned model back.
:func:`unpruned_state_dict` puts the removed heads back as zeros, which compute nothing:
that is how a pruned encoder is exported in the BERT layout, whose heads are all alike.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Union

import torch
from torch import Tensor, nn

from ..attention.multihead import MultiHeadAttention
from .encoder import TransformerEncoder, find_encoder

__all__ = ["prune_heads", "unpruned_state_dict"]


def _encoder(model: nn.Module) -> TransformerEncoder:
    encoder = find_encoder(model)
    if encoder is not None:
        return encoder
    raise TypeError(
        f"prune_heads takes an attnlab TransformerEncoder or a model with one as .encoder, "
        f"got {type(model).__name__}"
    )


def prune_heads(model: nn.Module, heads: Mapping[Union[str, int], Iterable[int]]) -> nn.Module:
    """Remove heads from the model's attention layers, in place.

    Args:
        model: a :class:`~attnlab.TransformerEncoder` or a model built on one
            (``EncoderClassifier``, ...), with dense attention.
        heads: ``{"layer_2": [0, 3]}`` or ``{1: [0, 3]}`` (a 0-based layer index): the
            heads to remove, 0-based in the *unpruned* numbering, as HuggingFace's
            ``prune_heads`` counted them. Heads already removed are skipped.

    Returns:
        ``model`` (pruned in place).

    Example:
        >>> prune_heads(classifier, {"layer_1": [0, 2]})
        >>> classifier.encoder.layers[0].self_attn.num_heads
        2
    """
    encoder = _encoder(model)
    config = encoder.config
    plan = {}
    for layer, chosen in heads.items():
        name = f"layer_{layer + 1}" if isinstance(layer, int) and not isinstance(layer, bool) else str(layer)
        if name not in {f"layer_{index + 1}" for index in range(config.num_layers)}:
            raise ValueError(
                f"unknown layer {layer!r}; name layer_1..layer_{config.num_layers} or 0..{config.num_layers - 1}"
            )
        attention = encoder.layers[int(name.removeprefix("layer_")) - 1].self_attn
        if not isinstance(attention, MultiHeadAttention):
            raise TypeError(
                f"{name} uses {type(attention).__name__}; only dense MultiHeadAttention heads can be pruned"
            )
        chosen = {int(head) for head in chosen}
        if any(not 0 <= head < config.num_heads for head in chosen):
            raise ValueError(
                f"{name}: heads are numbered 0..{config.num_heads - 1} (0-based), got {sorted(chosen)}"
            )
        before = set(config.pruned_heads.get(name, []))
        after = before | chosen
        if len(after) == config.num_heads:
            raise ValueError(
                f"{name}: pruning {sorted(chosen)} would remove all {config.num_heads} heads; keep one"
            )
        remaining = [
            head for head in range(config.num_heads) if head not in before
        ]  # original numbers, in order
        plan[name] = (attention, [remaining.index(head) for head in sorted(chosen - before)], sorted(after))
    for name, (attention, current, after) in plan.items():  # checked everything first: all or nothing
        attention.prune_heads(current)
        config.pruned_heads[name] = after
    return model


def unpruned_state_dict(encoder: TransformerEncoder) -> dict[str, Tensor]:
    """``encoder.state_dict()`` with every removed head back in place as zeros.

    A zero head has zero queries, keys and values and a zero column block in the output
    projection, so the full-size weights compute what the pruned encoder computes.

    Shape:
        ``in_proj_weight`` ``[3 * H' * D, E]`` -> ``[3 * H * D, E]``; ``in_proj_bias`` alike;
        ``out_proj.weight`` ``[E, H' * D]`` -> ``[E, H * D]``.
    """
    state = dict(encoder.state_dict())
    H = encoder.config.num_heads
    for name, removed in encoder.config.pruned_heads.items():
        index = int(name.removeprefix("layer_")) - 1
        attention = encoder.layers[index].self_attn
        D, prefix = attention.head_dim, f"layers.{index}.self_attn."
        kept = [head for head in range(H) if head not in removed]
        columns = torch.cat([torch.arange(head * D, (head + 1) * D) for head in kept])  # where kept heads go
        for key in ("in_proj_weight", "in_proj_bias"):
            if prefix + key not in state:
                continue
            current = state[prefix + key]  # [3 * H' * D, ...]
            full = current.new_zeros((3 * H * D,) + tuple(current.shape[1:]))
            for part, block in enumerate(current.chunk(3)):
                full[part * H * D + columns] = block
            state[prefix + key] = full
        current = state[prefix + "out_proj.weight"]  # [E, H' * D]
        full = current.new_zeros(current.shape[0], H * D)
        full[:, columns] = current
        state[prefix + "out_proj.weight"] = full
    return state
