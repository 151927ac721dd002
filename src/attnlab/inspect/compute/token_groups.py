"""Token groups whose attention mass the statistics report: ``[CLS]``, ``[SEP]``, punctuation."""

from __future__ import annotations

import unicodedata
from typing import Any

__all__ = ["special_token_groups"]

_CLS = ("[CLS]", "<s>", "[BOS]", "<bos>")
_SEP = ("[SEP]", "</s>", "[EOS]", "<eos>")


def _is_punctuation(token: str) -> bool:
    text = token.removeprefix("##").lstrip("\u0120\u2581")  # WordPiece / byte-BPE / SentencePiece marks
    return bool(text) and all(unicodedata.category(char).startswith("P") for char in text)


def special_token_groups(tokenizer: Any) -> dict[str, list[int]]:
    """``{"cls": ids, "sep": ids, "punct": ids}`` found in the tokenizer's vocabulary."""
    vocabulary = tokenizer.get_vocab()
    groups = {
        "cls": [vocabulary[token] for token in _CLS if token in vocabulary],
        "sep": [vocabulary[token] for token in _SEP if token in vocabulary],
        "punct": sorted(token_id for token, token_id in vocabulary.items() if _is_punctuation(token)),
    }
    return {name: ids for name, ids in groups.items() if ids}
