"""Word timestamps from a speech model's cross-attention, as openai-whisper's ``word_timestamps``
computes them (``whisper/timing.py``'s ``find_alignment``), in seconds.

Dimension letters: ``A`` alignment heads, ``T`` decoder rows, ``S`` encoder positions, ``P`` the
positions the clip covers, ``N`` text tokens.

The decoder reads ``[prompt, text tokens, end]`` (the prompt: :func:`~attnlab.hf.audio.speech_prompt`,
ending with the no-timestamps token) in one forward under :func:`~attnlab.hf.attach`. The alignment
heads' cross-attention (the generation config's ``alignment_heads``, ``[layer, head]`` from 0; without
them every head of the last half of the decoder's layers, whisper's default) becomes the matrix of
:func:`~attnlab.inspect.compute.time_alignment.alignment_matrix`; its rows that *predict* the text tokens
and the end token (the last prompt row to the last text row) go through dynamic time warping on the
negated matrix. Token ``n`` starts at the first position the path gives its row; a word starts where its
first token does and ends where the next word (or the end token) starts; position ``p`` is
``p * seconds_per_position`` seconds (20 ms for Whisper).

Words are split as whisper splits them: a new word at a piece that begins with a space, is
punctuation or is a special token (pieces are whole characters: tokens that decode to part of one
are kept together); punctuation then joins the word it belongs to (closing marks the word before,
opening marks the word after), keeping that word's times.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..inspect.compute.time_alignment import alignment_matrix, dtw_path
from .audio import AudioFeatures, speech_prompt
from .seq2seq import pair_attention

__all__ = ["SpeechAlignment", "WordTiming", "alignment_heads", "split_words", "word_timestamps"]

_CLOSING = "\"'.。,，!！?？:：”)]}、"
_OPENING = "\"'“¿([{-"


@dataclass
class WordTiming:
    """One word and where it is spoken, in seconds from the clip's start."""

    word: str
    start: float
    end: float
    tokens: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"word": self.word, "start": round(self.start, 3), "end": round(self.end, 3)}


@dataclass
class SpeechAlignment:
    """What :func:`word_timestamps` found.

    Attributes:
        words: the words with their times.
        matrix: ``[N + 1, P]`` the averaged alignment heads, one row per text token and the end token.
        rows, columns: the warping path through ``matrix`` (row and position indices).
        heads: the ``(layer, head)`` pairs used, from 0.
        seconds_per_position: the time one encoder position covers.
    """

    words: list[WordTiming]
    matrix: np.ndarray
    rows: np.ndarray
    columns: np.ndarray
    heads: list[tuple[int, int]]
    seconds_per_position: float


def alignment_heads(model: nn.Module) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs (from 0) whose cross-attention follows the speech: the generation
    config's ``alignment_heads``, else every head of the decoder's last half of layers."""
    layers = int(model.config.decoder_layers)
    heads = int(model.config.decoder_attention_heads)
    named = getattr(getattr(model, "generation_config", None), "alignment_heads", None)
    if not named:
        return [(layer, head) for layer in range(layers // 2, layers) for head in range(heads)]
    chosen = [(int(layer), int(head)) for layer, head in named]
    wrong = [pair for pair in chosen if not (0 <= pair[0] < layers and 0 <= pair[1] < heads)]
    if wrong:
        raise ValueError(f"the generation config's alignment_heads name {wrong}, outside the decoder's {layers} "
                         f"layers x {heads} heads; fix or remove them")
    return chosen


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[tuple[str, list[int]]]:
    """Tokens grouped into whole characters (a token that decodes to part of one waits for the rest)."""
    full = tokenizer.decode(list(ids), skip_special_tokens=False)
    pieces, current, offset = [], [], 0
    for token in ids:
        current.append(int(token))
        text = tokenizer.decode(current, skip_special_tokens=False)
        broken = text.find("\ufffd")
        if broken < 0 or full[offset + broken:offset + broken + 1] == "\ufffd":
            pieces.append((text, current))
            current, offset = [], offset + len(text)
    if current:
        pieces.append((tokenizer.decode(current, skip_special_tokens=False), current))
    return pieces


def split_words(tokenizer: Any, ids: Sequence[int], *, first_special: int) -> list[tuple[str, list[int]]]:
    """``[(word, its token ids)]``: whisper's split of ``ids`` at spaces, punctuation and special
    tokens (ids from ``first_special``: Whisper's end token and the ones after it)."""
    words: list[tuple[str, list[int]]] = []
    for text, tokens in _pieces(tokenizer, ids):
        special = tokens[0] >= first_special
        if special or text.startswith(" ") or text.strip() in string.punctuation or not words:
            words.append((text, list(tokens)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + tokens)
    return words


def _merge_punctuation(words: list[WordTiming]) -> list[WordTiming]:
    merged: list[WordTiming] = []
    opening: list[WordTiming] = []
    for word in words:
        text = word.word.strip()
        if text and all(mark in _CLOSING for mark in text) and merged and not opening:
            merged[-1].word += text
            merged[-1].tokens += word.tokens
        elif text and all(mark in _OPENING for mark in text):
            opening.append(word)
        else:
            word.word = "".join(mark.word.strip() for mark in opening) + text
            word.tokens = [token for mark in opening for token in mark.tokens] + word.tokens
            opening = []
            merged.append(word)
    return merged


def word_timestamps(model: nn.Module, tokenizer: Any, clip: AudioFeatures, text_ids: Sequence[int], *,
                    heads: Optional[Sequence[tuple[int, int]]] = None, prompt: Optional[Sequence[int]] = None,
                    median_width: int = 7) -> SpeechAlignment:
    """Each word of ``text_ids`` and when the model hears it (see the module docstring).

    Args:
        model: a transformers speech encoder-decoder (``WhisperForConditionalGeneration``).
        tokenizer: its tokenizer (``tokenizers.Tokenizer``: ``decode``), to split the words.
        clip: the clip's features and timing (:func:`~attnlab.hf.audio.audio_features`).
        text_ids: the transcript's tokens (its leading space included, no prompt, no end token).
        heads: ``(layer, head)`` pairs from 0 (default :func:`alignment_heads`).
        prompt: the decoder's prompt (default :func:`~attnlab.hf.audio.speech_prompt`).
        median_width: the median filter's width along time.
    """
    text = [int(token) for token in text_ids]
    end = getattr(model.config, "eos_token_id", None)
    if not isinstance(end, int):
        raise ValueError(f"{type(model).__name__}'s config names no eos_token_id; attnlab needs the end token "
                         f"to time the last word")
    if not text:
        return SpeechAlignment([], np.zeros((0, clip.positions)), np.zeros(0, int), np.zeros(0, int), [],
                               clip.seconds_per_position)
    prompt = speech_prompt(model) if prompt is None else [int(token) for token in prompt]
    heads = alignment_heads(model) if heads is None else [(int(layer), int(head)) for layer, head in heads]
    decoder_ids = torch.tensor(prompt + text + [end])  # [T]
    pair = pair_attention(model, None, decoder_ids, source_features=clip.features)
    layers = list(pair.cross.values())  # [H, T, S] each, in layer order
    chosen = torch.stack([layers[layer][head] for layer, head in heads])  # [A, T, S]
    positions = min(clip.positions, chosen.shape[-1])
    matrix = alignment_matrix(chosen, positions, median_width=median_width)[len(prompt) - 1:-1]  # [N + 1, P]
    rows, columns = dtw_path(-matrix)
    starts = columns[np.flatnonzero(np.diff(rows, prepend=-1))] * clip.seconds_per_position  # [N + 1]
    words = split_words(tokenizer, text + [end], first_special=end)
    boundaries = np.cumsum([0] + [len(tokens) for _, tokens in words])  # a word's first token, then the end's
    timed = [WordTiming(word.strip(), float(starts[boundaries[k]]), float(starts[boundaries[k + 1]]), tokens)
             for k, (word, tokens) in enumerate(words[:-1])]
    return SpeechAlignment(_merge_punctuation([word for word in timed if word.word]), matrix, rows, columns,
                           heads, clip.seconds_per_position)
