"""The faithfulness measures of one ranking of one input (``benchmarks/faithfulness.py``).

Dimension letters: ``R`` inputs in a batch, ``T`` tokens, ``E`` embedding width.

``q`` is the explained quantity: a classifier's probability of the class it predicts on the whole
text, or a decoder's ``log p(next token)`` of the token it predicts after the whole prompt. A
method's scores rank the input's *word* positions (special tokens, ``[CLS]``/``[SEP]``/``<bos>``,
always stay); the top k % is the first ``ceil(k n / 100)`` of ``n`` word positions, k = 0, 10, ..., 100.

* deletion AOPC   = mean over k of ``q(x) - q(x without its top k %)``: tokens are deleted, the
  sequence gets shorter (Samek et al. 2017; ERASER's comprehensiveness curve). Higher: more faithful.
* insertion AOPC  = mean over k of ``q(only the top k %, in their order) - q(none)``, where "none"
  keeps only the special tokens (a decoder's prompt left empty is its neutral token alone). Higher:
  the tokens a method puts first restore the quantity sooner.
* soft comprehensiveness = ``q(x) - E[q(x ⊙ m)]`` with ``m`` a Bernoulli mask on every element of
  the token embeddings (the token-embedding module's output), keeping token i's elements with
  probability ``1 - s_i``; soft sufficiency the same with probability ``s_i``; ``s`` the scores
  min-max normalised to [0, 1] over the word positions (Zhao & Aletras 2023, "Incorporating
  Attribution Importance for Improving Faithfulness Metrics", ACL). Comprehensiveness: higher is
  more faithful; sufficiency: lower is. Unlike the paper, neither is clipped at 0 nor divided by
  the empty input's figure: the random ranking's row stands beside every method's instead.
  The expectation is a mean over ``draws`` masks; every method (and the random ranking) sees the
  same uniform draws, so their differences are not blurred by the draws' noise.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.inspect.compute.attribution_target import token_embedding_of

MEASURES = ("deletion_aopc", "insertion_aopc", "soft_comprehensiveness", "soft_sufficiency")
STEPS = tuple(range(0, 101, 10))  # k, in % of the word tokens


def top_count(percent: int, n: int) -> int:
    """How many of ``n`` word tokens the top ``percent`` % holds: ``ceil(percent n / 100)``."""
    return math.ceil(percent * n / 100)


def curve_inputs(ids: list[int], words: list[int],
                 order: list[int]) -> tuple[list[list[int]], list[list[int]]]:
    """The deletion inputs (k = 10 .. 100 %) and the insertion inputs (k = 0 .. 90 %) of one ranking.

    Args:
        ids: the whole input's token ids.
        words: the positions a ranking orders (special tokens excluded).
        order: ``words`` from the most to the least important.
    Returns:
        ``(deleted, inserted)``: ``ids`` without its top k %, and ``ids`` with only its top k % (and
        the special tokens), each in the original order.
    """
    special = set(range(len(ids))) - set(words)
    deleted, inserted = [], []
    for percent in STEPS[1:]:
        top = set(order[: top_count(percent, len(words))])
        deleted.append([ids[i] for i in range(len(ids)) if i not in top])
    for percent in STEPS[:-1]:
        kept = set(order[: top_count(percent, len(words))]) | special
        inserted.append([ids[i] for i in range(len(ids)) if i in kept])
    return deleted, inserted


@contextlib.contextmanager
def masked_embeddings(model: nn.Module, masks: Tensor) -> Iterator[None]:
    """Multiply the token embedding's output by ``masks`` (``[R, T, E]``) while inside."""
    embedding, _ = token_embedding_of(model)

    def multiply(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return output * masks.to(output.dtype)

    handle = embedding.register_forward_hook(multiply)
    try:
        yield
    finally:
        handle.remove()


class Quantity:
    """``q`` of id sequences and of masked embeddings, for one input's explained class or token.

    Args:
        model: the classifier or decoder, in eval mode.
        target: the explained class or next token.
        decoder: ``True`` for ``log p(target)`` after the sequence, ``False`` for ``p(target)``.
        pad_id: the padding id (a classifier's batches are right-padded, a decoder's left-padded).
        batch: sequences per forward.
        empty_id: what an empty sequence reads instead (a decoder's neutral token).
    """

    def __init__(self, model: nn.Module, target: int, *, decoder: bool, pad_id: int, batch: int,
                 empty_id: Optional[int] = None) -> None:
        from attnlab.hf.opening import TransformersModel

        self.model, self.target, self.decoder, self.pad_id, self.batch = model, target, decoder, pad_id, batch
        self.empty_id = pad_id if empty_id is None else empty_id
        # a transformers language model computes the last position's logits alone when asked
        self.extra = {"logits_to_keep": 1} if decoder and isinstance(model, TransformersModel) else {}
        self.width = token_embedding_of(model)[0].weight.shape[1]

    def _read(self, logits: Tensor) -> np.ndarray:
        logits = (logits[:, -1] if self.decoder else logits).float()
        if self.decoder:
            return torch.log_softmax(logits, -1)[:, self.target].numpy()
        return torch.softmax(logits, -1)[:, self.target].numpy()

    def of_ids(self, sequences: Sequence[list[int]]) -> np.ndarray:
        """``q`` after each sequence (padded per batch, with a mask). Shape: ``[len(sequences)]``."""
        values = []
        sequences = [sequence or [self.empty_id] for sequence in sequences]
        for start in range(0, len(sequences), self.batch):
            chunk = sequences[start : start + self.batch]
            T = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), T), self.pad_id, dtype=torch.long)
            mask = torch.zeros(len(chunk), T, dtype=torch.bool)
            for row, sequence in enumerate(chunk):
                place = slice(T - len(sequence), T) if self.decoder else slice(0, len(sequence))
                ids[row, place] = torch.tensor(sequence)
                mask[row, place] = True
            with torch.no_grad():
                # the keep mask is every model's second argument (its keyword name differs)
                values.append(self._read(self.model(ids, mask, **self.extra).logits))
        return np.concatenate(values)

    def of_masked(self, ids: list[int], masks: Tensor) -> np.ndarray:
        """``q`` of ``ids`` with its token embeddings multiplied by each of ``masks`` (``[R, T, E]``).
        Shape: ``[R]``."""
        values = []
        for start in range(0, masks.shape[0], self.batch):
            chunk = masks[start : start + self.batch]
            batch = torch.tensor([ids]).expand(chunk.shape[0], -1)
            with torch.no_grad(), masked_embeddings(self.model, chunk):
                values.append(self._read(self.model(batch, **self.extra).logits))
        return np.concatenate(values)


def normalised(scores: np.ndarray) -> np.ndarray:
    """``scores`` min-max normalised to [0, 1] (all equal: all 0.5, no token preferred)."""
    low, high = float(scores.min()), float(scores.max())
    return np.full_like(scores, 0.5) if high - low <= 1e-12 else (scores - low) / (high - low)


def measure_input(
    quantity: Quantity, ids: list[int], words: list[int], rankings: dict[str, np.ndarray], *,
    draws: int, generator: Optional[torch.Generator] = None,
) -> dict[str, dict[str, float]]:
    """Every measure of every ranking of one input.

    Args:
        quantity: ``q`` of this input's explained class or token.
        ids: the input's token ids.
        words: the ranked positions; the others (special tokens) always stay.
        rankings: ``{method: scores over words}`` (higher: more important).
        draws: Bernoulli masks averaged per soft measure.
        generator: the masks' random numbers (the same for every method).
    Returns:
        ``{method: {measure: value}}``.
    """
    names = list(rankings)
    orders = {name: [words[i] for i in np.argsort(-rankings[name], kind="stable")] for name in names}
    full = float(quantity.of_ids([ids])[0])
    sequences: list[list[int]] = []
    for name in names:
        deleted, inserted = curve_inputs(ids, words, orders[name])
        sequences += deleted + inserted
    curves = quantity.of_ids(sequences).reshape(len(names), 2, len(STEPS) - 1)
    T = len(ids)
    uniform = torch.rand(draws, T, quantity.width, generator=generator)  # [draws, T, E]
    keep = []
    for name in names:
        comp = np.ones(T)
        suff = np.ones(T)
        importance = normalised(rankings[name].astype(np.float64))
        comp[words], suff[words] = 1 - importance, importance
        keep += [comp, suff]
    keep = torch.tensor(np.stack(keep), dtype=torch.float32)  # [2 * methods, T]
    masks = (uniform[None] < keep[:, None, :, None]).float().reshape(-1, T, quantity.width)
    soft = quantity.of_masked(ids, masks).reshape(len(names), 2, draws).mean(-1)
    found = {}
    for row, name in enumerate(names):
        deleted, inserted = curves[row]
        none = inserted[0]  # k = 0: only the special tokens
        found[name] = {
            "deletion_aopc": float(np.concatenate([[0.0], full - deleted]).mean()),
            "insertion_aopc": float(np.concatenate([inserted - none, [full - none]]).mean()),
            "soft_comprehensiveness": float(full - soft[row, 0]),
            "soft_sufficiency": float(full - soft[row, 1]),
        }
    return found


def interval(values: Sequence[float]) -> list[float]:
    """``[mean, low, high]``: the mean and its 95 % interval, ``mean ± t(0.975, n - 1) sd / √n``
    (Student's t; ``[mean, mean, mean]`` for one value)."""
    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return [mean, mean, mean]
    from scipy.stats import t

    half = float(t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return [mean, mean - half, mean + half]
