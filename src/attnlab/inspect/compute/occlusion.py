"""Occlusion of generated text: a token replaced by a neutral one, the change in what follows.

Dimension letters: ``N`` sequence length, ``P`` prompt length, ``G`` generated tokens.

The score of position ``s`` for generated token ``g`` is
``objective_g(ids) - objective_g(ids with ids[s] := neutral)`` (the objective of
:mod:`~attnlab.inspect.compute.next_token_objective`: the token's log-probability, or its
difference with a foil's), for every ``s <= P + g - 1``; later positions score 0 (the
prediction cannot see them). Positive: the token made the generated token more likely.
The length is kept (the token is replaced, not deleted), so positions do not move.

One forward pass per occluded position gives every generated token's change at once:
in a causal model, position ``P + g - 1`` sees exactly the prefix ``ids[:P + g]``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from .next_token_objective import check_sequence, decoder_logits, explained_positions, next_token_objective

__all__ = ["occlusion_scores"]


def occlusion_scores(
    model: nn.Module,
    input_ids: Tensor,
    prompt_length: int,
    *,
    neutral_id: int,
    foil_ids: Optional[Tensor] = None,
    batch_size: int = 16,
) -> Tensor:
    """Occlusion scores of every earlier position for each generated token.

    Args:
        model: a decoder (attnlab's, or a transformers causal LM).
        input_ids: ``[1, N]`` prompt then generated tokens.
        prompt_length: ``P``.
        neutral_id: the token put in place of the occluded one (a pad or end-of-text id).
        foil_ids: ``[G]`` contrast tokens, or ``None``.
        batch_size: occluded variants per forward pass.

    Returns:
        ``[G, N]``: row ``g`` scores positions ``0 .. P + g - 1``, zeros after.
    """
    N, P = check_sequence(input_ids, prompt_length)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    with torch.no_grad():
        base = next_token_objective(decoder_logits(model, input_ids), input_ids, P, foil_ids)[0]  # [G]
        occluded = []
        for start in range(0, N - 1, batch_size):
            positions = torch.arange(start, min(N - 1, start + batch_size))
            variants = input_ids.repeat(len(positions), 1)  # [k, N]
            variants[torch.arange(len(positions)), positions] = neutral_id
            occluded.append(next_token_objective(decoder_logits(model, variants), input_ids, P, foil_ids))
    changes = base[None, :] - torch.cat(occluded)  # [N - 1, G]
    scores = torch.zeros(N - P, N)
    visible = torch.arange(N - 1)[None, :] <= explained_positions(N, P)[:, None]  # [G, N - 1]
    scores[:, : N - 1] = torch.where(visible, changes.T.float().cpu(), 0.0)
    return scores
