"""A tokenizer that HuggingFace users can call: ``tok(texts, padding=True, return_tensors="pt")``.

:class:`Tokenizer` wraps a ``tokenizers.Tokenizer`` (the fast Rust tokenizer HuggingFace's
own fast tokenizers wrap). Calling it gives a :class:`BatchEncoding` with ``input_ids``,
``attention_mask`` (1 on real tokens) and, where the model has segment embeddings,
``token_type_ids``: ``model(**tok(texts, padding=True, return_tensors="pt"))`` works on
attnlab's models. Every other attribute is the wrapped tokenizer's (``encode``,
``encode_batch``, ``token_to_id``, ``save``, ...), so code written for
``tokenizers.Tokenizer`` keeps working.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from tokenizers import Tokenizer as BackendTokenizer

from .padding import PAD_TOKENS

__all__ = ["BatchEncoding", "Tokenizer"]

_PADDING_CHOICES = (True, False, "longest", "max_length", "do_not_pad")
# HuggingFace's truncation values -> the backend's strategy (None: no truncation)
_TRUNCATION_STRATEGIES = {True: "longest_first", "longest_first": "longest_first", "only_first": "only_first",
                          "only_second": "only_second", False: None, "do_not_truncate": None}


class BatchEncoding(dict):
    """What :class:`Tokenizer` returns: a dict (``**encoding`` passes it to a model) whose
    keys are also attributes (``encoding.input_ids``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"this encoding has no {name!r}; it has {sorted(self)}") from None


class Tokenizer:
    """A callable wrapper around a ``tokenizers.Tokenizer``.

    Args:
        backend: the ``tokenizers.Tokenizer`` to wrap (its own padding and truncation
            settings are left as they are: each call sets what it needs and restores them).
        model_max_length: the longest input the model takes; ``truncation=True`` without
            ``max_length`` cuts there.
        return_token_type_ids: include ``token_type_ids`` by default (models with segment
            embeddings).
        padding_side: ``"right"`` (encoders) or ``"left"`` (decoders, so that every row's
            last token is real and generation continues it).
        pad_token: the token that pads (default: ``[PAD]`` or ``<pad>`` when the vocabulary
            has one); decoders without one pad with their end-of-text token.

    Example:
        >>> tok = attnlab.load("minilm").tokenizer
        >>> batch = tok(["a short text", "a somewhat longer text"], padding=True, return_tensors="pt")
        >>> batch["input_ids"].shape == batch["attention_mask"].shape
        True
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        model_max_length: Optional[int] = None,
        return_token_type_ids: bool = False,
        padding_side: str = "right",
        pad_token: Optional[str] = None,
    ) -> None:
        if isinstance(backend, Tokenizer):
            backend = backend.backend
        if not isinstance(backend, BackendTokenizer):
            raise TypeError(f"backend must be a tokenizers.Tokenizer, got {type(backend).__name__}")
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if pad_token is not None and backend.token_to_id(pad_token) is None:
            raise ValueError(f"pad_token {pad_token!r} is not in the vocabulary")
        self.backend = backend
        self.padding_side = padding_side
        self._pad_token = pad_token
        self.model_max_length = model_max_length
        self.return_token_type_ids = return_token_type_ids

    @classmethod
    def from_file(cls, path: str, **options: Any) -> "Tokenizer":
        """Read a ``tokenizer.json``."""
        return cls(BackendTokenizer.from_file(str(path)), **options)

    def __getattr__(self, name: str) -> Any:
        if name == "backend":  # not set yet (during unpickling): never recurse
            raise AttributeError(name)
        return getattr(self.backend, name)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.backend.get_vocab_size()}, "
            f"model_max_length={self.model_max_length}, "
            f"pad_token={self.pad_token!r})"
        )

    @property
    def pad_token(self) -> Optional[str]:
        """The padding token given, else ``[PAD]`` (or ``<pad>``) when the vocabulary has it."""
        if getattr(self, "_pad_token", None) is not None:
            return self._pad_token
        return next((token for token in PAD_TOKENS if self.backend.token_to_id(token) is not None), None)

    @property
    def pad_token_id(self) -> Optional[int]:
        token = self.pad_token
        return None if token is None else self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Union[str, list[str]]:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(index)) for index in ids]

    def convert_tokens_to_ids(
        self, tokens: Union[str, Sequence[str]]
    ) -> Union[Optional[int], list[Optional[int]]]:
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(token) for token in tokens]

    def _max_length(self, truncation: Any, max_length: Optional[int], padding: Any) -> Optional[int]:
        if max_length is not None:
            if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
                raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
            return max_length
        if truncation or padding == "max_length":
            if self.model_max_length is None:
                raise ValueError(
                    "truncation=True and padding='max_length' need max_length=N: this tokenizer does "
                    "not know its model's limit"
                )
            return self.model_max_length
        return None

    def __call__(
        self,
        text: Union[str, Sequence[str]],
        text_pair: Optional[Union[str, Sequence[str]]] = None,
        *,
        padding: Union[bool, str] = False,
        truncation: Union[bool, str] = False,
        max_length: Optional[int] = None,
        return_tensors: Optional[str] = None,
        return_attention_mask: bool = True,
        return_token_type_ids: Optional[bool] = None,
        add_special_tokens: bool = True,
    ) -> BatchEncoding:
        """Encode one text or a batch, as a HuggingFace tokenizer does; sentence pairs too.

        Args:
            text: a string or a list of strings.
            text_pair: the second text of each pair (a string, or a list as long as
                ``text``): ``[CLS] a [SEP] b [SEP]`` with ``token_type_ids`` 0 then 1.
            padding: ``True`` / ``"longest"`` pads to the longest text of the batch,
                ``"max_length"`` to ``max_length``; ``False`` leaves lengths as they are.
            truncation: cut texts to ``max_length`` (default: the model's limit),
                keeping the special tokens; for pairs ``True`` / ``"longest_first"`` takes
                tokens from the longer text first, ``"only_first"`` / ``"only_second"`` from
                one of them, as HuggingFace's.
            max_length: the length to cut or pad to.
            return_tensors: ``"pt"`` for ``[B, T]`` torch tensors (a single text gives
                ``[1, T]``); ``None`` for lists.
            return_attention_mask: include ``attention_mask`` (1 on real tokens).
            return_token_type_ids: include ``token_type_ids``; default: whether the model
                has segment embeddings.
            add_special_tokens: add ``[CLS]`` / ``[SEP]`` (or the tokenizer's own).
        """
        if padding not in _PADDING_CHOICES:
            raise ValueError(f"padding must be one of {_PADDING_CHOICES}, got {padding!r}")
        if truncation not in _TRUNCATION_STRATEGIES:
            raise ValueError(f"truncation must be one of {list(_TRUNCATION_STRATEGIES)}, got {truncation!r}")
        if return_tensors not in (None, "pt"):
            raise ValueError(
                f"return_tensors must be 'pt' or None (attnlab works in torch), got {return_tensors!r}"
            )
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(item, str) for item in texts):
            raise TypeError("text must be a string or a list of strings")
        inputs: list = texts
        if text_pair is not None:
            seconds = [text_pair] if isinstance(text_pair, str) else list(text_pair)
            if isinstance(text_pair, str) != single or not all(isinstance(item, str) for item in seconds):
                raise TypeError("text_pair must be a string when text is one, or a list of strings when text is a list")
            if len(seconds) != len(texts):
                raise ValueError(f"text has {len(texts)} texts and text_pair {len(seconds)}; pass one second "
                                 f"text per first text")
            inputs = list(zip(texts, seconds))
        padding = "longest" if padding is True else (False if padding == "do_not_pad" else padding)
        strategy = _TRUNCATION_STRATEGIES[truncation]
        length = self._max_length(strategy is not None, max_length, padding)
        backend = self.backend
        previous_truncation, previous_padding = backend.truncation, backend.padding
        backend.no_padding()
        backend.no_truncation()
        try:
            if strategy is not None and length is not None:
                backend.enable_truncation(length, strategy=strategy)
            if padding:
                pad_id = self.pad_token_id
                if pad_id is None:
                    raise ValueError("padding needs a [PAD] or <pad> token, and this vocabulary has neither")
                backend.enable_padding(
                    pad_id=pad_id,
                    pad_token=self.pad_token,
                    length=length if padding == "max_length" else None,
                    direction=self.padding_side,
                )
            try:
                encodings = backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
            except Exception as error:  # the backend raises a bare Exception for a cut it cannot make
                if "Truncation error" not in str(error):
                    raise
                raise ValueError(f"truncation={truncation!r} cannot cut every input to max_length={length}: "
                                 f"{error}; use truncation=True (longest first) or a larger max_length") from None
        finally:
            backend.no_padding()
            backend.no_truncation()
            if previous_truncation:
                backend.enable_truncation(**previous_truncation)
            if previous_padding:
                backend.enable_padding(**previous_padding)
        with_types = self.return_token_type_ids if return_token_type_ids is None else return_token_type_ids
        columns = {"input_ids": [encoding.ids for encoding in encodings]}
        if with_types:
            columns["token_type_ids"] = [encoding.type_ids for encoding in encodings]
        if return_attention_mask:
            columns["attention_mask"] = [encoding.attention_mask for encoding in encodings]
        if return_tensors == "pt":
            lengths = {len(ids) for ids in columns["input_ids"]}
            if len(lengths) > 1:
                raise ValueError(
                    f"the texts have different lengths ({min(lengths)} to {max(lengths)} tokens): pass "
                    f"padding=True to make one [B, T] tensor"
                )
            tensors = {key: torch.tensor(value, dtype=torch.long) for key, value in columns.items()}
            return BatchEncoding(tensors)
        if single:
            return BatchEncoding({key: value[0] for key, value in columns.items()})
        return BatchEncoding(columns)

    def decode(self, ids: Union[Sequence[int], torch.Tensor], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (a list or a 1-D tensor)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(
        self, batch: Union[Sequence[Sequence[int]], torch.Tensor], *, skip_special_tokens: bool = True
    ) -> list[str]:
        if isinstance(batch, torch.Tensor):
            batch = batch.tolist()
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]
