"""Tokenizers from the ``tokenizers`` library: trained on the training split, or loaded.

A trained tokenizer lowercases, splits BERT-style and wraps every text as
``[CLS] ... [SEP]``; its special tokens have fixed ids (``[PAD]`` is 0).

Training is repeatable: the same texts give the same vocabulary and ids in every
process. The library's WordPiece trainer numbers the ``##``-continuation of each
character in hash order (which changes from process to process) and breaks ties between
equally frequent merges by those numbers, so two trainings differed in a few tokens and
in many ids. Here the continuations are numbered first, in sorted order, so the ties fall
the same way every time. A run still saves its ``tokenizer.json``; resuming reads it back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence, Union

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ._errors import DataError

__all__ = [
    "SPECIAL_TOKENS", "TOKENIZER_KINDS", "train_tokenizer", "load_tokenizer_file", "encode_texts", "special_ids",
    "token_texts",
]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
TOKENIZER_KINDS = ("wordpiece", "bpe")


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 8000,
    kind: str = "wordpiece",
    lowercase: bool = True,
    min_frequency: int = 2,
) -> Tokenizer:
    """Train a WordPiece or BPE vocabulary on ``texts`` (the training split only).

    Args:
        texts: training texts.
        vocab_size: largest vocabulary, special tokens included.
        kind: ``"wordpiece"`` or ``"bpe"``.
        lowercase: lowercase and strip accents before splitting.
        min_frequency: a merge must occur at least this often.
    """
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"kind must be one of {TOKENIZER_KINDS}, got {kind!r}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    texts = list(texts)
    normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        # the continuations numbered before the trainer meets them (see the module docstring)
        continuations = [f"##{char}" for char in _continuation_characters(texts, normalizer, pre_tokenizer)]
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS) + continuations, show_progress=False,
        )
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if kind == "wordpiece":
        # the same vocabulary in a tokenizer whose only added tokens are the real special tokens
        vocabulary = tokenizer.get_vocab(with_added_tokens=False)
        tokenizer = Tokenizer(models.WordPiece(vocabulary, unk_token="[UNK]"))
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
        tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
        tokenizer.decoder = decoders.WordPiece()
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return tokenizer


def _continuation_characters(texts: Sequence[str], normalizer, pre_tokenizer) -> list[str]:
    """Every character that follows another inside a word, sorted."""
    seen: set[str] = set()
    for text in texts:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
            seen.update(word[1:])
    return sorted(seen)


def load_tokenizer_file(path: Union[str, Path]) -> Tokenizer:
    """Load a ``tokenizer.json``; it must know a ``[PAD]`` token."""
    path = Path(path)
    if not path.is_file():
        problem = "is a directory; name its tokenizer.json" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"tokenizer file {path} {problem}")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # the library raises a bare Exception on malformed files
        raise DataError(f"{path}: not a tokenizers JSON file ({error})") from None
    if tokenizer.token_to_id("[PAD]") is None:
        raise DataError(f"{path}: the tokenizer has no [PAD] token")
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """``{"[PAD]": id, ...}`` for the special tokens this tokenizer knows."""
    found = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    return {token: index for token, index in found.items() if index is not None}


_SHOWN_AS = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def token_texts(tokenizer: Tokenizer, ids: Sequence[int], tokens: Sequence[str]) -> list[str]:
    """What each token reads as, for labels: ``"cat"`` for byte-level BPE's ``"Ġcat"``.

    Tokenizers whose vocabulary is written in a private alphabet (byte-level BPE's ``Ġ`` for
    a space, ``Ċ`` for a newline; SentencePiece's ``▁``) are decoded one token at a time;
    WordPiece tokens are kept as they are (``##ing`` says that it continues a word, and its
    decoding would drop that). Newlines and tabs are shown as ``\\n`` and ``\\t``, a token
    that is only spaces as ``␣``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
        ids: the token ids.
        tokens: their vocabulary strings (``encoding.tokens``), kept where decoding gives nothing.
    """
    decoder = getattr(tokenizer, "decoder", None)
    if decoder is None or isinstance(decoder, decoders.WordPiece):
        return list(tokens)
    shown = []
    for index, token in zip(ids, tokens):
        text = tokenizer.decode([int(index)], skip_special_tokens=False)
        text = "".join(_SHOWN_AS.get(char, char) for char in text)
        shown.append(text if text.strip() else (text.replace(" ", "␣") or token))  # a bare space: ␣
    return shown


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], *, max_length: int) -> list[list[int]]:
    """Token ids for each text, special tokens included, cut to ``max_length`` (no padding).

    The tokenizer's own truncation and padding settings are restored afterwards.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (room for [CLS] and [SEP]), got {max_length}")
    previous_truncation, previous_padding = tokenizer.truncation, tokenizer.padding
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    try:
        return [encoding.ids for encoding in tokenizer.encode_batch(list(texts))]
    finally:
        tokenizer.no_truncation()
        if previous_truncation:
            tokenizer.enable_truncation(**previous_truncation)
        if previous_padding:
            tokenizer.enable_padding(**previous_padding)
