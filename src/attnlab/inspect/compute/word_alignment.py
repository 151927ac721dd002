"""Word alignment from attention or hidden states, and its score against a gold standard.

Dimension letters: ``L`` layers, ``H`` heads, ``T`` target positions, ``S`` source
positions, ``E`` hidden size.

An alignment is a set of links ``(i, j)``: source word ``i`` and target word ``j``, both
counted from 0, written in the Pharaoh format as ``i-j`` (``"0-0 1-2 2-1"``). A gold file
holds one line per sentence pair; ``i-j`` is a *sure* link and ``i?j`` a *possible* one
(every sure link is possible too).

Three ways to align:

* :func:`attention_alignment`: cross-attention ``[T, S]`` (chosen layers and heads, or
  all averaged); each target word is linked to the source word it attends to most.
* :func:`similarity_alignment` with ``"argmax"`` (SimAlign, Jalili Sabet et al. 2020):
  cosine similarity of the two sides' hidden states; ``(i, j)`` is linked when ``j`` is
  ``i``'s most similar target word and ``i`` is ``j``'s most similar source word.
* ``"itermax"``: argmax, then up to ``iterations - 1`` more rounds that link words still
  unaligned on one or both sides, their similarities scaled by ``alpha`` (0.9) where one
  side is already aligned (SimAlign's defaults).

:func:`alignment_error_rate` scores a corpus (Och & Ney 2003): with ``A`` the predicted,
``S`` the sure and ``P`` the possible links summed over sentences, ``precision =
|A & P| / |A|``, ``recall = |A & S| / |S|`` and ``AER = 1 - (|A & S| + |A & P|) / (|A| + |S|)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = [
    "AlignmentScore",
    "GoldAlignment",
    "alignment_error_rate",
    "attention_alignment",
    "format_pharaoh",
    "parse_pharaoh",
    "read_alignments",
    "similarity_alignment",
    "word_matrix",
]

Links = frozenset  # of (source word, target word)


@dataclass(frozen=True)
class GoldAlignment:
    """One sentence pair's gold links: ``sure`` and ``possible`` (sure links included)."""

    sure: frozenset
    possible: frozenset


@dataclass(frozen=True)
class AlignmentScore:
    """Corpus-level scores (fractions in ``[0, 1]``) and the counts behind them."""

    aer: float
    precision: float
    recall: float
    predicted: int
    sure: int
    sentences: int

    def to_dict(self) -> dict:
        return {"aer": self.aer, "precision": self.precision, "recall": self.recall,
                "predicted_links": self.predicted, "sure_links": self.sure, "sentences": self.sentences}


def parse_pharaoh(line: str, *, where: str = "alignment") -> GoldAlignment:
    """``"0-0 1?2"`` -> sure ``{(0, 0)}``, possible ``{(0, 0), (1, 2)}``.

    Raises:
        ValueError: a link that is not ``i-j`` or ``i?j`` with ``i, j >= 0``; ``where`` names
            the file and line in the message.
    """
    sure, possible = set(), set()
    for item in line.split():
        separator = "-" if "-" in item else "?"
        parts = item.split(separator)
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise ValueError(f"{where}: {item!r} is not a link; write source-target word indices from 0 as "
                             f"i-j (sure) or i?j (possible)")
        link = (int(parts[0]), int(parts[1]))
        possible.add(link)
        if separator == "-":
            sure.add(link)
    return GoldAlignment(frozenset(sure), frozenset(possible))


def format_pharaoh(links: Union[set, frozenset, Sequence[tuple[int, int]]]) -> str:
    """Links as one Pharaoh line, sorted: ``"0-0 1-2 2-1"``."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


def read_alignments(path: Union[str, Path], *, argument: str = "alignments") -> list[GoldAlignment]:
    """Every line of a Pharaoh file (an empty line is a pair with no link).

    Raises:
        FileNotFoundError: no such file (the message names ``argument``).
        ValueError: a malformed link, naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{argument} {str(path)!r}: no such file")
    lines = path.read_text(encoding="utf-8").splitlines()
    return [parse_pharaoh(line, where=f"{argument} {path.name} line {number}")
            for number, line in enumerate(lines, 1)]


def alignment_error_rate(predicted: Sequence, gold: Sequence[GoldAlignment]) -> AlignmentScore:
    """AER, precision and recall of ``predicted`` (link sets, or :class:`GoldAlignment` whose
    ``possible`` links are taken) against ``gold``, counted over the whole corpus.

    Raises:
        ValueError: the two hold different numbers of sentence pairs.
    """
    if len(predicted) != len(gold):
        raise ValueError(f"the alignments hold {len(predicted)} sentence pairs and the gold file "
                         f"{len(gold)}; give one line per pair in both")
    a_total = s_total = a_and_s = a_and_p = 0
    for links, reference in zip(predicted, gold):
        links = set(links.possible if isinstance(links, GoldAlignment) else links)
        a_total += len(links)
        s_total += len(reference.sure)
        a_and_s += len(links & reference.sure)
        a_and_p += len(links & (reference.possible | reference.sure))
    precision = a_and_p / a_total if a_total else 0.0
    recall = a_and_s / s_total if s_total else 0.0
    aer = 1.0 - (a_and_s + a_and_p) / (a_total + s_total) if a_total + s_total else 0.0
    return AlignmentScore(aer, precision, recall, a_total, s_total, len(gold))


def word_matrix(matrix: Tensor, rows: Sequence[Optional[int]], columns: Sequence[Optional[int]]) -> Tensor:
    """Pool a ``[T, S]`` map over sub-word pieces into words: the mean over each word's pieces.

    ``rows[t]`` and ``columns[s]`` are the word of each position (``None`` for special tokens,
    which are dropped). Returns ``[words in rows, words in columns]``.
    """
    if matrix.dim() != 2 or matrix.shape != (len(rows), len(columns)):
        raise ValueError(f"matrix must be [T, S] = ({len(rows)}, {len(columns)}) for the word ids given, "
                         f"got {tuple(matrix.shape)}")

    def pooling(words: Sequence[Optional[int]]) -> Tensor:
        count = 1 + max((w for w in words if w is not None), default=-1)
        pool = torch.zeros(count, len(words), dtype=torch.float64)  # [words, positions]
        for position, word in enumerate(words):
            if word is not None:
                pool[word, position] = 1.0
        missing = [w for w in range(count) if pool[w].sum() == 0]
        if missing:
            raise ValueError(f"word {missing[0]} has no position; word ids must run 0, 1, 2, ... without gaps")
        return pool / pool.sum(1, keepdim=True)

    return pooling(rows) @ matrix.double() @ pooling(columns).T


def attention_alignment(
    attentions: Union[Tensor, Mapping[str, Tensor]],
    *,
    layers: Optional[Sequence[str]] = None,
    heads: Optional[Sequence[int]] = None,
    target_words: Optional[Sequence[Optional[int]]] = None,
    source_words: Optional[Sequence[Optional[int]]] = None,
) -> frozenset:
    """Links from cross-attention: each target word to the source word it attends to most.

    Args:
        attentions: one example's cross-attention, ``[T, S]``, ``[H, T, S]``, or
            ``{"cross.layer_1": [H, T, S], ...}``.
        layers: the layer names averaged (default every layer given).
        heads: 0-based heads averaged (default every head).
        target_words, source_words: word of each target / source position (``None`` for
            special tokens); default one word per position.

    Returns:
        ``{(source word, target word), ...}``.
    """
    if isinstance(attentions, Mapping):
        names = list(attentions) if layers is None else list(layers)
        unknown = [name for name in names if name not in attentions]
        if unknown or not names:
            missing = repr(unknown[0]) if unknown else "(none given)"
            raise ValueError(f"layers: no cross-attention layer {missing}; "
                             f"this model has {', '.join(attentions)}")
        stack = torch.stack([attentions[name].detach().double() for name in names])  # [L, H, T, S]
    else:
        stack = attentions.detach().double()
        stack = stack[None, None] if stack.dim() == 2 else stack[None]
        if layers is not None:
            raise ValueError("layers picks names from a mapping {layer: [H, T, S]}; a single map has none")
    if stack.dim() != 4:
        raise ValueError(f"attentions must be [T, S], [H, T, S] or per layer [H, T, S], got {tuple(stack.shape)}")
    if heads is not None:
        bad = [h for h in heads if not 0 <= h < stack.shape[1]]
        if bad or not heads:
            raise ValueError(f"heads must be 0-based indices below {stack.shape[1]}, got {list(heads)}")
        stack = stack[:, list(heads)]
    matrix = stack.mean((0, 1))  # [T, S]
    T, S = matrix.shape
    matrix = word_matrix(matrix, list(range(T)) if target_words is None else target_words,
                         list(range(S)) if source_words is None else source_words)
    best = matrix.argmax(-1)  # [target words]
    return frozenset((int(source), target) for target, source in enumerate(best.tolist()))


def _argmax_links(similarity: Tensor) -> Tensor:
    """``[S, T]`` 0/1: both sides' argmax agree."""
    S, T = similarity.shape
    forward = torch.zeros_like(similarity)
    forward[torch.arange(S), similarity.argmax(1)] = 1.0
    backward = torch.zeros_like(similarity)
    backward[similarity.argmax(0), torch.arange(T)] = 1.0
    return forward * backward


def similarity_alignment(
    source_states: Tensor,
    target_states: Tensor,
    *,
    method: str = "itermax",
    source_words: Optional[Sequence[Optional[int]]] = None,
    target_words: Optional[Sequence[Optional[int]]] = None,
    iterations: int = 2,
    alpha: float = 0.9,
) -> frozenset:
    """SimAlign's links from the two sides' hidden states (see the module docstring).

    Args:
        source_states: ``[S, E]`` one layer's hidden states of the source.
        target_states: ``[T, E]`` the same layer's of the target.
        method: ``"argmax"`` or ``"itermax"``.
        source_words, target_words: word of each position (``None``: special token); the
            similarity of two words is the mean over their pieces' similarities.
        iterations, alpha: itermax's rounds and the weight of half-aligned pairs.

    Returns:
        ``{(source word, target word), ...}``.
    """
    if method not in ("argmax", "itermax"):
        raise ValueError(f"method must be 'argmax' or 'itermax', got {method!r}")
    if source_states.dim() != 2 or target_states.dim() != 2 or source_states.shape[1] != target_states.shape[1]:
        raise ValueError(f"source_states [S, E] and target_states [T, E] must share E, got "
                         f"{tuple(source_states.shape)} and {tuple(target_states.shape)}")
    source = torch.nn.functional.normalize(source_states.detach().double(), dim=-1)
    target = torch.nn.functional.normalize(target_states.detach().double(), dim=-1)
    similarity = source @ target.T  # [S, T] cosine
    S, T = similarity.shape
    similarity = word_matrix(similarity, list(range(S)) if source_words is None else source_words,
                             list(range(T)) if target_words is None else target_words)
    links = _argmax_links(similarity)
    if method == "itermax" and min(similarity.shape) > 2:
        for _ in range(iterations - 1):
            source_free = 1.0 - links.sum(1, keepdim=True).clamp(max=1.0)  # [S, 1]: 1 if unaligned
            target_free = 1.0 - links.sum(0, keepdim=True).clamp(max=1.0)  # [1, T]
            if source_free.sum() < 1 or target_free.sum() < 1:
                break
            weight = (alpha * source_free + alpha * target_free).clamp(max=1.0)  # 0 where both aligned
            either_free = 1.0 - (1.0 - source_free) * (1.0 - target_free)  # [S, T]
            new = _argmax_links(similarity * weight) * either_free
            if torch.equal(links + new, links):
                break
            links = links + new
    return frozenset((int(i), int(j)) for i, j in torch.nonzero(links > 0).tolist())
