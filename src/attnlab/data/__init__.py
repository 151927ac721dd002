"""Data: the embedded Rotten Tomatoes set, text files (CSV/JSONL/TXT) read by one set of rules,
tokenization, padding, collation and batching."""

from ._errors import DataError
from .collate import MaskedLMCollator, PaddingCollator, TokenizedDataset, mask_tokens
from .padding import PAD_TOKENS, model_pad_id, pad_id_for, pad_token_ids, tokenizer_pad_id
from .rotten_tomatoes import LABEL_NAMES, load_rotten_tomatoes
from .splits import DatasetSplits, split_examples
from .text_batches import encode_batches
from .text_files import load_text_classification, read_labelled_texts, read_rows, read_texts
from .texts import load_texts
from .tokenizer import BatchEncoding, Tokenizer
from .tokenization import SPECIAL_TOKENS, encode_texts, load_tokenizer_file, special_ids, train_tokenizer

__all__ = [
    "BatchEncoding",
    "DataError",
    "DatasetSplits",
    "LABEL_NAMES",
    "MaskedLMCollator",
    "PAD_TOKENS",
    "PaddingCollator",
    "SPECIAL_TOKENS",
    "TokenizedDataset",
    "Tokenizer",
    "encode_batches",
    "encode_texts",
    "load_rotten_tomatoes",
    "load_text_classification",
    "load_texts",
    "load_tokenizer_file",
    "mask_tokens",
    "model_pad_id",
    "pad_id_for",
    "pad_token_ids",
    "read_labelled_texts",
    "read_rows",
    "read_texts",
    "special_ids",
    "split_examples",
    "tokenizer_pad_id",
    "train_tokenizer",
]
