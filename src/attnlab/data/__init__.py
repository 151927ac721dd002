"""Data: the embedded Rotten Tomatoes set, CSV/JSONL loaders, tokenization, collation."""

from ._errors import DataError
from .collate import MaskedLMCollator, PaddingCollator, TokenizedDataset, mask_tokens
from .rotten_tomatoes import LABEL_NAMES, load_rotten_tomatoes
from .splits import DatasetSplits, split_examples
from .text_files import load_text_classification, read_labelled_texts
from .tokenization import SPECIAL_TOKENS, encode_texts, load_tokenizer_file, special_ids, train_tokenizer

__all__ = [
    "DataError",
    "DatasetSplits",
    "LABEL_NAMES",
    "MaskedLMCollator",
    "PaddingCollator",
    "SPECIAL_TOKENS",
    "TokenizedDataset",
    "encode_texts",
    "load_rotten_tomatoes",
    "load_text_classification",
    "load_tokenizer_file",
    "mask_tokens",
    "read_labelled_texts",
    "special_ids",
    "split_examples",
    "train_tokenizer",
]
