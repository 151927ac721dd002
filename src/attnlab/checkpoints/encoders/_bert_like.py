"""``config.json`` <-> :class:`~attnlab.EncoderConfig` for the BERT-like families.

RoBERTa, XLM-R, ELECTRA, ALBERT, MPNet and DistilBERT describe the same post-norm
encoder with learned positions; they differ in key names (DistilBERT's ``dim``,
``n_layers``), in what is fixed (DistilBERT's LayerNorm epsilon) and in the components
their block spec adds. One reader and one writer, with each family's keys, serve them all.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ...layers import EncoderConfig
from ...models.encoder import TransformerEncoder
from ..errors import UnsupportedCheckpointError, problems_error

__all__ = [
    "ACTIVATIONS_FROM_HF",
    "ACTIVATIONS_TO_HF",
    "BERT_KEYS",
    "POST_NORM",
    "read_config",
    "write_config",
]

# HF activation name -> attnlab's. HF's "gelu" is the exact erf GELU.
ACTIVATIONS_FROM_HF = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}

# EncoderConfig field -> config.json key, as BERT names them.
BERT_KEYS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "d_ff": "intermediate_size",
    "dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "max_len": "max_position_embeddings",
    "activation": "hidden_act",
    "layer_norm_eps": "layer_norm_eps",
    "type_vocab_size": "type_vocab_size",
    "pad_id": "pad_token_id",
}
_REQUIRED = ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff")

# The options that make attnlab's encoder a post-norm BERT-like one.
POST_NORM: dict[str, Any] = {
    "norm_first": False,
    "position": "learned",
    "embedding_norm": True,
    "final_norm": False,
    "scale_embeddings": False,
    "bias": True,
    "attention": "dense",
}


def read_config(
    values: dict[str, Any],
    source: str,
    *,
    family: str,
    keys: Mapping[str, str] = BERT_KEYS,
    defaults: Optional[dict[str, Any]] = None,
    fixed: Optional[dict[str, Any]] = None,
    problems: Sequence[str] = (),
) -> EncoderConfig:
    """The :class:`EncoderConfig` of a BERT-like ``config.json``.

    Args:
        values: the ``config.json`` dict.
        source: its path, for messages.
        family: the family's name, for messages.
        keys: EncoderConfig field -> config key, for the fields the file may hold.
        defaults: values of fields the file leaves out (HF's config defaults).
        fixed: fields the family fixes (and that overrule ``POST_NORM``).
        problems: problems the family found already; all are listed together.

    Raises:
        UnsupportedCheckpointError: listing every setting attnlab cannot reproduce.
    """
    problems = list(problems)
    defaults = {
        "dropout": 0.1,
        "max_len": 512,
        "activation": "gelu",
        "layer_norm_eps": 1e-12,
        "type_vocab_size": 2,
        "pad_id": None,
        **(defaults or {}),
    }
    given = {name: values[key] for name, key in keys.items() if key in values and values[key] is not None}
    read = {**defaults, **given}
    if values.get("is_decoder") or values.get("add_cross_attention"):
        problems.append("is_decoder/add_cross_attention is set; only the bidirectional encoder is supported")
    if values.get("position_embedding_type", "absolute") != "absolute":
        problems.append(
            f"position_embedding_type is {values['position_embedding_type']!r}; only 'absolute' is supported"
        )
    if read["activation"] not in ACTIVATIONS_FROM_HF:
        problems.append(
            f"{keys.get('activation', 'activation')} is {read['activation']!r}; "
            f"supported: {sorted(ACTIVATIONS_FROM_HF)}"
        )
    missing = [keys[name] for name in _REQUIRED if name not in read]
    if missing:
        problems.append(f"missing keys {missing}")
    if problems:
        raise problems_error(f"{source} does not describe a supported {family} encoder", problems)
    dropout = float(read["dropout"])
    attention_dropout = float(read.get("attention_dropout", dropout))
    fields = {
        **{name: read[name] for name in _REQUIRED},
        "dropout": dropout,
        "max_len": read["max_len"],
        # None means "same as dropout", so a saved and reloaded config compares equal.
        "attention_dropout": None if attention_dropout == dropout else attention_dropout,
        "pad_id": read["pad_id"],
        "activation": ACTIVATIONS_FROM_HF[read["activation"]],
        "layer_norm_eps": float(read["layer_norm_eps"]),
        "type_vocab_size": read["type_vocab_size"],
        **POST_NORM,
        **(fixed or {}),
    }
    try:
        return EncoderConfig(**fields)
    except ValueError as error:
        raise UnsupportedCheckpointError(f"{source} holds values attnlab cannot use: {error}") from error


def write_config(
    encoder: TransformerEncoder,
    original: Optional[dict[str, Any]],
    *,
    family: str,
    keys: Mapping[str, str] = BERT_KEYS,
    skip: Sequence[str] = ("max_len", "type_vocab_size", "layer_norm_eps"),
) -> dict[str, Any]:
    """The checkpoint's own ``config.json`` with the values attnlab may have changed.

    Keys the encoder does not model (token ids, initialiser range, ...) are kept as
    they were. ``skip`` names fields the family's components own (a position table's
    length), which are written back unchanged.

    Raises:
        UnsupportedCheckpointError: the encoder was not opened from such a checkpoint.
    """
    if original is None:
        raise UnsupportedCheckpointError(
            f"this encoder was not opened from a {family} checkpoint, so its {family} config is unknown; "
            f"open one with attnlab.from_pretrained(dir) and save that"
        )
    config = encoder.config
    values = dict(original)
    for name, key in keys.items():
        if name in skip:
            continue
        value = getattr(config, name)
        if name == "attention_dropout":
            value = config.effective_attention_dropout
        elif name == "activation":
            value = ACTIVATIONS_TO_HF[value]
        values[key] = value
    return values
