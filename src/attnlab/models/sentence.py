"""Sentence embeddings from an encoder: mean pooling over real tokens, then L2 norm.

This is what sentence-transformers computes for all-MiniLM-L6-v2 (``Transformer ->
Pooling(mean) -> Normalize``).

Dimension letters: ``N`` texts, ``B`` batch, ``T`` length, ``E`` model dim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from tokenizers import Encoding, Tokenizer
from torch import Tensor

from .._masked_mean import masked_mean
from .._pretrained_io import loader
from ..data.padding import pad_token_ids
from .encoder import TransformerEncoder

PathLike = Union[str, Path]

__all__ = ["SentenceEncoder", "mean_pool", "pad_encodings"]


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """Average of the hidden states of real tokens.

    Args:
        hidden: ``[B, T, E]`` encoder output.
        mask: ``[B, T]``, ``True`` (or 1) on real tokens.

    Shape:
        ``[B, T, E]``, ``[B, T]`` -> ``[B, E]``. A row without real tokens gives zeros.
    """
    if hidden.dim() != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"hidden must be [B, T, E] and mask [B, T]; got {tuple(hidden.shape)} and {tuple(mask.shape)}"
        )
    return masked_mean(hidden, mask, keepdim=False)


def pad_encodings(encodings: Sequence[Encoding], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad tokenizer encodings into ``(input_ids [B, T], mask [B, T])``.

    ``mask`` is ``True`` on real tokens.
    """
    return pad_token_ids([encoding.ids for encoding in encodings], pad_id)


class SentenceEncoder:
    """Encode texts into sentence embeddings with an attnlab encoder.

    Args:
        model: the encoder.
        tokenizer: a tokenizer with padding switched off (see
            :func:`~attnlab.checkpoints.encoders.loading.load_tokenizer`).
        max_length: longest input in tokens, special tokens included; longer texts
            are truncated.
        normalize: L2-normalise the pooled vectors.

    Example:
        >>> encoder = SentenceEncoder.from_pretrained("minilm")
        >>> encoder.encode(["a cat sat", "a dog sat"]).shape
        torch.Size([2, 384])
    """

    def __init__(
        self,
        model: TransformerEncoder,
        tokenizer: Tokenizer,
        *,
        max_length: int = 256,
        normalize: bool = True,
    ) -> None:
        if model.config.pad_id is None:
            raise ValueError("model.config.pad_id is None; SentenceEncoder needs a pad id to batch texts")
        if max_length > model.config.max_len:
            raise ValueError(f"max_length={max_length} exceeds the model's max_len={model.config.max_len}")
        self.model = model
        # A private copy that truncates like sentence-transformers: the special tokens
        # stay, the text in between is cut.
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)
        self.max_length = max_length
        self.normalize = normalize

    @classmethod
    def from_pretrained(cls, name_or_path: PathLike = "minilm", *, max_length: Optional[int] = None,
                        normalize: bool = True) -> "SentenceEncoder":
        """Load model and tokenizer; ``max_length`` defaults to the checkpoint's
        ``sentence_bert_config.json`` (256 for MiniLM), else the model's ``max_len``."""
        model = loader().from_pretrained(name_or_path, task="encoder")
        if max_length is None:
            settings = loader().pretrained_dir(name_or_path) / "sentence_bert_config.json"
            if settings.is_file():
                max_length = int(json.loads(settings.read_text(encoding="utf-8"))["max_seq_length"])
            else:
                max_length = model.config.max_len
        return cls(model, loader().load_tokenizer(name_or_path), max_length=max_length, normalize=normalize)

    def embed_batch(self, input_ids: Tensor, mask: Tensor) -> Tensor:
        """Embeddings of one padded batch: ``[B, T]`` ids and mask -> ``[B, E]``."""
        hidden = self.model(input_ids, mask).last_hidden_state  # [B, T, E]
        pooled = mean_pool(hidden, mask)  # [B, E]
        return F.normalize(pooled, p=2, dim=1) if self.normalize else pooled

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> Tensor:
        """Embed ``texts``; returns ``[N, E]`` in the order given.

        Texts are batched by length (less padding); the model runs in eval mode and
        its previous mode is restored afterwards.
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not one string; wrap it in a list")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        encodings = self.tokenizer.encode_batch(list(texts))
        order = sorted(range(len(encodings)), key=lambda index: -len(encodings[index].ids))
        parameter = next(self.model.parameters())
        output = torch.empty(len(encodings), self.model.config.d_model, dtype=parameter.dtype)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    rows = order[start:start + batch_size]
                    input_ids, mask = pad_encodings([encodings[row] for row in rows], self.model.config.pad_id)
                    embedded = self.embed_batch(input_ids.to(parameter.device), mask.to(parameter.device))
                    output[rows] = embedded.cpu()
        finally:
            self.model.train(was_training)
        return output
