"""What each attention head does: previous-token, duplicate-token, induction and first-token scores.

Dimension letters: ``L`` layers, ``B`` batch, ``H`` heads, ``T`` length.

Each role is a 0/1 pattern ``R[t, s]`` over a causal map, built from the token ids the
way TransformerLens's ``head_detector`` builds its detection patterns:

====================  ==============================================================
``previous-token``    ``R[t, t - 1] = 1`` (TransformerLens: ``previous_token_head``)
``duplicate-token``   ``R[t, s] = 1`` for ``s < t`` with ``ids[s] == ids[t]`` (``duplicate_token_head``)
``induction``         ``R[t, s] = 1`` for ``0 < s <= t`` with ``ids[s - 1] == ids[t]``, ``s - 1 < t``:
                      the token after an earlier copy of the current one (``induction_head``)
``first-token``       ``R[t, 0] = 1`` for ``t >= 1``: attention parked on the first token (a sink)
====================  ==============================================================

A head's score is the attention mass it puts on the pattern, averaged over the query
rows that have a pattern position at all (and over the batch)::

    score = mean over {t : R[t, :] has a 1} of  sum_s A[t, s] R[t, s]

so a head that does the role perfectly scores 1 and one that never does scores 0, whatever
the share of rows where the role can apply. TransformerLens's ``mul`` measure divides the
same mass by every row (``sum(A * R) / sum(A)``, rows summing to 1):
:func:`transformer_lens_score` computes it, and it equals ours times the share of rows
that have a pattern position.

The repeated-random-tokens test (Olsson et al. 2022): ``n`` random tokens, then the same
``n`` again; a model with induction heads predicts the second copy far better than the
first (:func:`repeated_tokens_loss`), and its induction heads score high on that sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from .inspectable import inspectable

__all__ = ["HEAD_ROLES", "HeadRoles", "RepeatedTokensLoss", "role_patterns", "head_role_scores",
           "transformer_lens_score", "repeated_random_tokens", "repeated_tokens_loss", "find_head_roles"]

HEAD_ROLES = ("previous-token", "duplicate-token", "induction", "first-token")


def role_patterns(input_ids: Tensor) -> dict[str, Tensor]:
    """``{role: [T, T] bool}`` patterns of one sequence ``[T]`` (see the module docstring)."""
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be one sequence [T], got {tuple(input_ids.shape)}")
    T = input_ids.shape[0]
    t = torch.arange(T)[:, None]
    s = torch.arange(T)[None, :]
    same = input_ids[:, None] == input_ids[None, :]  # [T, T]: ids[t] == ids[s]
    duplicate = same & (s < t)
    induction = torch.zeros(T, T, dtype=torch.bool)
    induction[:, 1:] = duplicate[:, :-1]  # s - 1 a copy of t, s - 1 < t, so s <= t
    return {
        "previous-token": s == t - 1,
        "duplicate-token": duplicate,
        "induction": induction,
        "first-token": (s == 0) & (t >= 1),
    }


def _layers(attentions: Sequence[Tensor], B: int, T: int) -> list[Tensor]:
    layers = list(attentions.values()) if hasattr(attentions, "values") else list(attentions)
    if not layers:
        raise ValueError("attentions is empty; expected one [B, H, T, T] map per layer")
    for index, weights in enumerate(layers):
        if weights.dim() != 4 or weights.shape[0] != B or weights.shape[-2:] != (T, T):
            raise ValueError(f"layer_{index + 1} must be [B, H, T, T] with B = {B}, T = {T}, "
                             f"got {tuple(weights.shape)}")
    return layers


def head_role_scores(attentions: Sequence[Tensor], input_ids: Tensor) -> dict[str, Tensor]:
    """Every role's score per layer and head.

    Args:
        attentions: per layer ``[B, H, T, T]`` (a list or a ``{"layer_1": ...}`` mapping).
        input_ids: ``[B, T]`` the tokens the maps were computed on (no padding).

    Returns:
        ``{role: [L, H]}``; NaN for a role no row of the input can show (no repeated token).
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got {tuple(input_ids.shape)}")
    B, T = input_ids.shape
    layers = _layers(attentions, B, T)
    patterns = [role_patterns(row.cpu()) for row in input_ids]
    scores = {}
    for role in HEAD_ROLES:
        masks = torch.stack([pattern[role] for pattern in patterns]).float()  # [B, T, T]
        rows = masks.amax(-1)  # [B, T]: rows that have a pattern position
        count = rows.sum()
        per_layer = []
        for weights in layers:
            mass = (weights.detach().float().cpu() * masks[:, None]).sum(-1)  # [B, H, T]
            per_layer.append((mass * rows[:, None]).sum((0, 2)) / count if count > 0
                             else torch.full((weights.shape[1],), float("nan")))
        scores[role] = torch.stack(per_layer)  # [L, H]
    return scores


def transformer_lens_score(attention: Tensor, pattern: Tensor) -> Tensor:
    """TransformerLens's ``mul`` detection score: ``sum(A * R) / sum(A)`` per head.

    Args:
        attention: ``[H, T, T]`` one sequence's maps.
        pattern: ``[T, T]`` a role pattern.

    Returns:
        ``[H]``.
    """
    attention = attention.float()
    return (attention * pattern.float()).sum((-2, -1)) / attention.sum((-2, -1))


@dataclass
class RepeatedTokensLoss:
    """Mean next-token cross-entropy (nats) on the first and the second copy of random tokens."""

    first_copy: float
    second_copy: float


@dataclass
class HeadRoles:
    """What :func:`find_head_roles` measured.

    Attributes:
        scores: ``{role: [L, H]}``.
        input_ids: ``[B, T]`` the sequence(s) scored.
        repeated_tokens: the losses, when the input was the repeated random tokens.
    """

    scores: dict[str, Tensor] = field(default_factory=dict)
    input_ids: Optional[Tensor] = None
    repeated_tokens: Optional[RepeatedTokensLoss] = None

    def strongest(self, role: str, count: int = 3) -> list[tuple[int, int, float]]:
        """The ``count`` highest-scoring heads for ``role`` as ``(layer, head, score)``, from 1."""
        values = torch.nan_to_num(self.scores[role], nan=-1.0)
        H = values.shape[1]
        order = values.flatten().argsort(descending=True)[:count].tolist()
        return [(index // H + 1, index % H + 1, float(values.flatten()[index])) for index in order]


def repeated_random_tokens(vocab_size: int, length: int, *, seed: int = 0, bos_id: Optional[int] = None,
                           exclude: Sequence[int] = ()) -> Tensor:
    """``[1, (1 +) 2 * length]``: ``length`` random tokens twice, after ``bos_id`` if given.

    Tokens are drawn without repeats from the vocabulary minus ``exclude`` (special ids).
    """
    if length < 2:
        raise ValueError(f"length must be at least 2, got {length}")
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[[index for index in exclude if index is not None and 0 <= index < vocab_size]] = False
    candidates = allowed.nonzero()[:, 0]
    if len(candidates) < length:
        raise ValueError(f"length {length} is more than the {len(candidates)} usable tokens of the vocabulary")
    generator = torch.Generator().manual_seed(seed)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:length]]
    start = [] if bos_id is None else [bos_id]
    return torch.tensor([start + chosen.tolist() * 2])


def repeated_tokens_loss(logits: Tensor, input_ids: Tensor, length: int) -> RepeatedTokensLoss:
    """Losses on each copy of :func:`repeated_random_tokens`: the tokens 2..n of each copy
    (the first token of a copy cannot be predicted from before it), ``n - 1`` tokens each.

    Args:
        logits: ``[1, N]`` the model's logits on ``input_ids`` (``[1, N, V]``).
        input_ids: ``[1, N]`` with ``N = 2 n`` or ``2 n + 1`` (a first token before the copies).
        length: ``n``.
    """
    N = input_ids.shape[1]
    offset = N - 2 * length
    if offset not in (0, 1):
        raise ValueError(f"input_ids of length {N} is not two copies of {length} tokens (with or without a "
                         f"first token)")
    losses = torch.nn.functional.cross_entropy(logits[0, :-1].float(), input_ids[0, 1:], reduction="none")  # [N-1]
    # target position q is predicted at q - 1; copy c holds positions offset + c n .. offset + (c + 1) n - 1
    first = losses[offset: offset + length - 1]
    second = losses[offset + length: offset + 2 * length - 1]
    return RepeatedTokensLoss(float(first.mean()), float(second.mean()))


def find_head_roles(
    model: nn.Module,
    input_ids: Optional[Tensor] = None,
    *,
    length: int = 50,
    seed: int = 0,
    bos_id: Optional[int] = None,
    exclude: Sequence[int] = (),
) -> HeadRoles:
    """Score every head of ``model`` for every role.

    Args:
        model: a decoder (attnlab's, or a :class:`~attnlab.hf.opening.TransformersModel`).
        input_ids: ``[B, T]`` unpadded sequences; default :func:`repeated_random_tokens`
            (``length``, ``seed``, ``bos_id``, ``exclude``), and then the losses of
            :func:`repeated_tokens_loss` come with the scores.

    Returns:
        :class:`HeadRoles`.
    """
    view = inspectable(model)
    if view.kind != "decoder":
        article = "an" if view.kind[0] in "aeiou" else "a"
        raise ValueError(f"head roles (previous-token, duplicate-token, induction, first-token) are read from a "
                         f"decoder's causal attention; {view.architecture} is {article} {view.kind} model")
    repeated = input_ids is None
    if repeated:
        vocab_size = _vocab_size(model)
        input_ids = repeated_random_tokens(vocab_size, length, seed=seed, bos_id=bos_id, exclude=exclude)
    elif not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got {getattr(input_ids, 'shape', type(input_ids).__name__)}")
    with torch.no_grad(), view.record() as captured:
        output = view(input_ids)
    maps = list(captured.attentions.values())
    result = HeadRoles(head_role_scores(maps, input_ids), input_ids)
    if repeated:
        result.repeated_tokens = repeated_tokens_loss(output.logits, input_ids, length)
    return result


def _vocab_size(model: nn.Module) -> int:
    config = getattr(model, "config", None)
    for name in ("vocab_size",):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"{type(model).__name__}: no config.vocab_size; pass input_ids")
