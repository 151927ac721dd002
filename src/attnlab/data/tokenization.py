"""Tokenizers from the ``tokenizers`` library: trained on the training split, or loaded.

A trained tokenizer lowercases, splits BERT-style and wraps every text as
``[CLS] ... [SEP]``; its special tokens have fixed ids (``[PAD]`` is 0).

The library's trainers break ties between equally frequent merges in hash order, so
two trainings on the same texts can differ in a few tokens and in many ids. A run
therefore saves its ``tokenizer.json``; resuming reads it back, and passing it as
``data.tokenizer`` repeats a run exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence, Union

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ._errors import DataError

__all__ = ["SPECIAL_TOKENS", "TOKENIZER_KINDS", "train_tokenizer", "load_tokenizer_file", "encode_texts", "special_ids"]

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
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
        tokenizer.decoder = decoders.WordPiece()
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
        )
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    return tokenizer


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
