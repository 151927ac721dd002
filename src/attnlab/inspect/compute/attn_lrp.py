"""AttnLRP (Achtibat et al., ICML 2024): the relevance of every input token for one logit.

Dimension letters: ``B`` batch, ``T`` length, ``N`` sequence length (prompt + generated),
``P`` prompt length, ``G`` explained generated tokens, ``E`` model dim, ``C`` classes.

Under AttnLRP's backward rules (:mod:`~attnlab.inspect.compute.attn_lrp_rules`) the relevance
of any tensor is the tensor times its gradient, and the relevance of the input is that at the
output of the token embedding, summed over ``E``. The backward pass starts at 1, so the
output's relevance is the explained logit itself (``logit x 1``; ``max_logits.backward()`` in
the authors' efficient examples: "the relevance is initialized with the value of max_logits").
Seeding with the logit's value (``logit.backward(logit)``) belongs to their explicit
implementation, where ``.grad`` already holds relevance; here it would start at ``logit^2``.
The rules keep the relevance, so the tokens' relevances sum to the logit up to what biases
(GPT-2's, Qwen2's query/key/value biases, LayerNorm's, position embeddings added after the
token embedding) and the softmax's own rule absorb. Each result carries the explained logit
and that sum, so the gap is in plain view.

AttnLRP explains a **logit**, not a log-probability: for a generated token, the logit of the
token at the position that predicts it (the logit difference with a foil for a contrastive
question, which is also the difference of the two log-probabilities); for a classifier, the
logit of the explained class.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import torch
from torch import Tensor, nn

from .attn_lrp_rules import attn_lrp_rules
from .attribution_target import logits_of, resolve_target, token_embedding_of
from .inspectable import inspectable, require
from .next_token_objective import check_sequence, decoder_logits, explained_positions, token_embedding_module

__all__ = ["AttnLRP", "attn_lrp_classifier", "attn_lrp_generation"]


@dataclass
class AttnLRP:
    """AttnLRP relevances of one or more explained logits.

    Attributes:
        scores: ``[K, T]`` each token's relevance for each explained logit (``[G, N]`` for
            generated tokens, ``[B, T]`` for a classifier's texts), in the model's dtype.
        logit: ``[K]`` the explained logit (or logit difference).
        total: ``[K]`` the sum of each row of ``scores``: equal to ``logit`` where the rules
            conserve relevance; ``total - logit`` is what the model's biases absorbed.
        target: ``[B]`` a classifier's explained class (``None`` for generated tokens).
        logits: ``[B, C]`` a classifier's logits (``None`` for generated tokens).
    """

    scores: Tensor
    logit: Tensor
    total: Tensor
    target: Optional[Tensor] = None
    logits: Optional[Tensor] = None


@contextlib.contextmanager
def _embeddings_as_leaf(embedding: nn.Module) -> Iterator[list[Tensor]]:
    """The embedding's output of the next forward, made a leaf that requires a gradient (yielded
    in a list once the forward ran)."""
    leaves: list[Tensor] = []

    def replace(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        leaf = output.detach().requires_grad_(True)
        leaves.append(leaf)
        return leaf

    handle = embedding.register_forward_hook(replace)
    try:
        yield leaves
    finally:
        handle.remove()


def _relevance(model: nn.Module, embedding: nn.Module, forward: Callable[[], Tensor],
               explained: Callable[[Tensor], Tensor], *, together: bool = False) -> tuple[Tensor, Tensor]:
    """``([K, B, T] relevances, [K] logits)``: one forward under the rules, one backward per
    explained logit (starting at 1: the output's relevance is the logit); ``together``: one backward for all
    (``K = B`` logits of ``B`` texts that do not interact), giving ``[1, B, T]``."""
    with attn_lrp_rules(model), _embeddings_as_leaf(embedding) as leaves, torch.enable_grad():
        values = explained(forward())  # [K]
        if not leaves:
            raise ValueError(f"{type(model).__name__}: its token embedding did not run in the forward; "
                             f"attn-lrp reads the relevance there")
        inputs = leaves[0]  # [B, T, E]
        if together:
            (gradient,) = torch.autograd.grad(values.sum(), inputs)
            return (inputs.detach() * gradient).sum(-1)[None], values.detach()  # [1, B, T]
        rows = []
        for k in range(values.shape[0]):
            (gradient,) = torch.autograd.grad(values[k], inputs, retain_graph=k < values.shape[0] - 1)
            rows.append((inputs.detach() * gradient).sum(-1))  # [B, T]
    return torch.stack(rows), values.detach()


def attn_lrp_generation(
    model: nn.Module, input_ids: Tensor, prompt_length: int, foil_ids: Optional[Tensor] = None
) -> AttnLRP:
    """AttnLRP relevances of every generated token's logit, one backward per token.

    Args:
        model: a decoder (attnlab's, or a transformers causal LM served by attnlab's attention).
        input_ids: ``[1, N]`` prompt then generated tokens.
        prompt_length: ``P``.
        foil_ids: ``[G]`` contrast tokens: explain ``logit(target) - logit(foil)``.

    Returns:
        :class:`AttnLRP` with ``scores`` ``[G, N]`` (row ``g`` is 0 after position ``P + g - 1``:
        a causal model's position sees only the prefix).

    Raises:
        ValueError: a module AttnLRP's rules do not know (by name).
    """
    N, P = check_sequence(input_ids, prompt_length)
    require(inspectable(model), "input_embeddings", "attn-lrp")
    positions = explained_positions(N, P)  # [G]
    targets = input_ids[0, P:]  # [G]

    def explained(logits: Tensor) -> Tensor:
        rows = logits[0, positions.to(logits.device)]  # [G, V]
        chosen = rows.gather(-1, targets.to(logits.device)[:, None])[:, 0]  # [G]
        if foil_ids is not None:
            chosen = chosen - rows.gather(-1, foil_ids.to(logits.device)[:, None])[:, 0]
        return chosen

    embedding = token_embedding_module(model)
    relevance, logit = _relevance(model, embedding, lambda: decoder_logits(model, input_ids), explained)
    scores = relevance[:, 0]  # [G, N]
    return AttnLRP(scores=scores, logit=logit, total=scores.sum(-1))


def attn_lrp_classifier(
    model: nn.Module,
    input_ids: Tensor,
    mask: Optional[Tensor] = None,
    target: Optional[Union[int, str]] = None,
) -> AttnLRP:
    """AttnLRP relevances of each text's class logit (the prediction, or ``target``).

    Args:
        model: attnlab's classifier, or a transformers sequence classifier served by
            attnlab's attention.
        input_ids: ``[B, T]``.
        mask: ``[B, T]``, ``True`` on real tokens (default: every position).
        target: class index, label name, or ``None`` for the prediction.

    Returns:
        :class:`AttnLRP` with ``scores`` ``[B, T]``, ``target`` and ``logits``.

    Raises:
        ValueError: a module AttnLRP's rules do not know (by name).
    """
    require(inspectable(model), "input_embeddings", "attn-lrp")
    embedding, _ = token_embedding_of(model)
    keep = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask.bool()
    found: dict[str, Tensor] = {}

    def explained(logits: Tensor) -> Tensor:
        found["logits"] = logits.detach()
        found["target"] = resolve_target(logits.detach(), target, getattr(model, "label_names", None))
        return logits.gather(-1, found["target"][:, None])[:, 0]  # [B]

    def forward() -> Tensor:
        return logits_of(model(input_ids, mask=keep))

    # one backward for the batch: the texts do not interact
    relevance, logit = _relevance(model, embedding, forward, explained, together=True)
    scores = relevance[0]  # [B, T]
    return AttnLRP(scores=scores, logit=logit, total=scores.sum(-1), target=found["target"],
                   logits=found["logits"])
