"""The tokenizer a GGUF file describes in its metadata, as a ``tokenizers.Tokenizer``.

Byte-level BPE (``tokenizer.ggml.model = "gpt2"``, as GPT-2, SmolLM, Llama 3 and Qwen2
use): the vocabulary is ``tokenizer.ggml.tokens``, the merges ``tokenizer.ggml.merges``,
and tokens of type 3 (control) become special tokens (``<|im_start|>``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from ..errors import UnsupportedCheckpointError

__all__ = ["tokenizer_from_gguf"]

_CONTROL = 3


def _strings(field) -> list[str]:
    return [bytes(field.parts[index]).decode("utf-8") for index in field.data]


def tokenizer_from_gguf(source: Any) -> Tokenizer:
    """Build the byte-level BPE tokenizer of a GGUF file (no padding, no truncation).

    Args:
        source: the file's path, or a ``GGUFReader`` of it (one reader serves the weights
            and the tokenizer: :func:`~attnlab.checkpoints.gguf.weights.open_gguf`).

    Raises:
        UnsupportedCheckpointError: the file holds another kind of tokenizer (SentencePiece's ``llama``).
    """
    from .weights import open_gguf

    reader = open_gguf(source)
    kind = reader.fields["tokenizer.ggml.model"].contents()
    if kind != "gpt2":
        where = source if isinstance(source, (str, Path)) else "the GGUF file"
        raise UnsupportedCheckpointError(
            f"{where}: tokenizer model {kind!r} is not supported (only byte-level 'gpt2')")
    tokens = _strings(reader.fields["tokenizer.ggml.tokens"])
    merges = [tuple(merge.split(" ", 1)) for merge in _strings(reader.fields["tokenizer.ggml.merges"])]
    types = [int(value) for value in reader.fields["tokenizer.ggml.token_type"].contents()]
    tokenizer = Tokenizer(BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=merges,
                              fuse_unk=False, byte_fallback=False))
    pre = reader.fields.get("tokenizer.ggml.pre")
    steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre is not None and pre.contents() == "smollm":  # SmolLM splits every digit
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token, kind in zip(tokens, types) if kind == _CONTROL])
    return tokenizer
