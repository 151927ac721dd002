"""The logit lens (nostalgebraist 2020): what a decoder would predict after every layer.

Dimension letters: ``L`` layers, ``N`` sequence length, ``Q`` read positions, ``K`` top
tokens, ``V`` vocabulary, ``E`` model dim.

The residual stream after layer ``l`` (the embeddings for ``l = 0``) goes through the
model's final norm and its LM head, as the last layer's does: ``softmax(head(norm(h_l)))``.
The last row is the model's own prediction (its logits as returned). For attnlab's
decoders the norm and head are ``model.norm`` and ``model.lm_head``; for a transformers
language model (a :class:`~attnlab.hf.opening.TransformersModel`) the hidden states come
from ``output_hidden_states=True`` and the norm is the base model's final one (``norm``,
``ln_f``, ``final_layernorm`` or ``final_layer_norm``), the head ``get_output_embeddings()``,
with ``final_logit_softcapping`` applied where the config has it (Gemma).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from .inspectable import inspectable

__all__ = ["LogitLens", "logit_lens", "lens_readout"]

@dataclass
class LogitLens:
    """Attributes:
        layers: ``L + 1`` names: ``"embeddings"``, ``"layer_1"``, ..., ``"layer_L"``.
        positions: ``[Q]`` the positions read (each predicts the token after it).
        top_ids, top_probabilities: ``[L + 1, Q, K]`` the most likely next tokens after each layer.
        target_ids: ``[Q]`` the token followed at each position (the next one in the input), or ``None``.
        target_ranks: ``[L + 1, Q]`` its rank, 1 = most likely.
        target_probabilities: ``[L + 1, Q]``.
    """

    layers: list[str]
    positions: Tensor
    top_ids: Tensor
    top_probabilities: Tensor
    target_ids: Optional[Tensor] = None
    target_ranks: Optional[Tensor] = None
    target_probabilities: Optional[Tensor] = None


def lens_readout(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """``hidden [.., E] -> logits [.., V]``: the model's final norm then its LM head
    (:meth:`~attnlab.inspect.compute.inspectable.Inspectable.readout`).

    Raises:
        TypeError: the model has none (it is not a decoder-only language model).
    """
    view = inspectable(model)
    reason = view.unsupported("readout")
    if reason is not None:
        raise TypeError(reason)
    return view.readout()


def logit_lens(
    model: nn.Module, input_ids: Tensor, *, positions: Optional[Tensor] = None, top_k: int = 5
) -> LogitLens:
    """Read the next-token distribution after every layer at ``positions``.

    Args:
        model: a decoder (attnlab's, or a :class:`~attnlab.hf.opening.TransformersModel`).
        input_ids: ``[1, N]``.
        positions: ``[Q]`` positions to read (default every position); the target of
            position ``q < N - 1`` is ``input_ids[0, q + 1]``.
        top_k: tokens kept per layer and position.

    Returns:
        :class:`LogitLens`.
    """
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one sequence [1, N], got {getattr(input_ids, 'shape', input_ids)}")
    N = input_ids.shape[1]
    positions = torch.arange(N) if positions is None else torch.as_tensor(positions).long()
    if positions.numel() == 0 or int(positions.min()) < 0 or int(positions.max()) >= N:
        raise ValueError(f"positions must lie in [0, {N}), got {positions.tolist()}")
    readout = lens_readout(model)
    with torch.no_grad():
        output = model(input_ids, output_hidden_states=True)
        hidden = output.hidden_states  # L + 1 tensors [1, N, E]
        rows = [readout(state[0, positions]) for state in hidden[:-1]]  # [Q, V] per layer
        rows.append(output.logits[0, positions])  # the model's own prediction
    probabilities = torch.softmax(torch.stack(rows).float(), -1)  # [L + 1, Q, V]
    top = probabilities.topk(min(top_k, probabilities.shape[-1]), -1)
    result = LogitLens(["embeddings"] + [f"layer_{index}" for index in range(1, len(rows))], positions,
                       top.indices, top.values)
    if int(positions.max()) < N - 1:
        targets = input_ids[0, positions + 1]  # [Q]
        chosen = probabilities.gather(-1, targets[None, :, None].expand(len(rows), -1, 1))  # [L + 1, Q, 1]
        result.target_ids = targets
        result.target_probabilities = chosen[..., 0]
        result.target_ranks = (probabilities > chosen).sum(-1) + 1
    return result
