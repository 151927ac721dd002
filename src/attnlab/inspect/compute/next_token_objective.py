"""What an explanation of generated text explains: each generated token's log-probability.

Dimension letters: ``B`` batch, ``N`` sequence length (prompt + generated), ``G``
explained (generated) tokens, ``V`` vocabulary, ``E`` model dim.

A sequence ``ids [1, N]`` holds a prompt of ``P`` tokens and ``G = N - P`` generated (or
given) tokens. Generated token ``g`` (0-based) sits at position ``P + g`` and is predicted
by position ``p_g = P + g - 1``, which sees positions ``0 .. p_g``. The explained quantity
is its log-probability there, ``log p(ids[P + g] | ids[:P + g])``, or, for a contrastive
question ("why this token and not the foil?"), ``log p(target) - log p(foil)`` at the same
position (the softmax's normaliser cancels: it is also the difference of the two logits).
Every method of :mod:`~attnlab.inspect.compute.generation_attribution` explains it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor, nn

__all__ = ["decoder_logits", "explained_positions", "next_token_objective", "token_embedding_module",
           "check_sequence"]


def check_sequence(input_ids: Any, prompt_length: Any) -> tuple[int, int]:
    """``(N, P)`` of one explained sequence, or a ``ValueError`` naming what is wrong."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1 \
            or input_ids.dtype.is_floating_point:
        got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be one integer sequence [1, N] (prompt + generated), got {got}")
    N = input_ids.shape[1]
    if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or not 1 <= prompt_length < N:
        raise ValueError(f"prompt_length must be an int in [1, {N - 1}] (at least one prompt token and one "
                         f"generated token in the {N} given), got {prompt_length!r}")
    return N, prompt_length


def explained_positions(N: int, P: int) -> Tensor:
    """``[G]``: the position that predicts each generated token, ``P - 1 .. N - 2``."""
    return torch.arange(P - 1, N - 1)


def decoder_logits(model: nn.Module, input_ids: Tensor) -> Tensor:
    """``[B, N, V]`` next-token logits of attnlab's decoder or a transformers causal LM
    (:class:`~attnlab.hf.opening.TransformersModel` or the bare model)."""
    output = model(input_ids)
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)):
        logits = output[0]
    if not isinstance(logits, Tensor) or logits.dim() != 3:
        raise TypeError(f"{type(model).__name__} gives no [B, N, V] next-token logits; explaining generated "
                        f"text needs a language model (a decoder such as GPT-2, Llama, Qwen2, SmolLM2)")
    return logits


def next_token_objective(
    logits: Tensor, input_ids: Tensor, prompt_length: int, foil_ids: Optional[Tensor] = None
) -> Tensor:
    """The explained quantity of every generated token, for each row of a batch of variants.

    Args:
        logits: ``[B, N, V]`` logits of ``B`` variants of one sequence (the same targets).
        input_ids: ``[1, N]`` the original sequence: its tokens after the prompt are the targets.
        prompt_length: ``P``.
        foil_ids: ``[G]`` contrast tokens (``None``: the plain log-probability).

    Returns:
        ``[B, G]``: ``log p(target_g)`` (minus ``log p(foil_g)``) at position ``P + g - 1``.
    """
    N, P = input_ids.shape[1], prompt_length
    positions = explained_positions(N, P).to(logits.device)  # [G]
    log_probs = torch.log_softmax(logits[:, positions].float(), -1)  # [B, G, V]
    targets = input_ids[0, P:].to(logits.device)  # [G]
    index = targets[None, :, None].expand(logits.shape[0], -1, 1)
    chosen = log_probs.gather(-1, index)[..., 0]  # [B, G]
    if foil_ids is not None:
        foils = foil_ids.to(logits.device)[None, :, None].expand(logits.shape[0], -1, 1)
        chosen = chosen - log_probs.gather(-1, foils)[..., 0]
    return chosen


def token_embedding_module(model: nn.Module) -> nn.Module:
    """The token embedding whose output integrated gradients interpolates
    (:meth:`~attnlab.inspect.compute.inspectable.Inspectable.input_embeddings`)."""
    from .inspectable import inspectable, require

    view = inspectable(model)
    require(view, "input_embeddings", "integrated gradients")
    return view.input_embeddings()
