"""A BERT ``config.json`` and attnlab's :class:`~attnlab.EncoderConfig`, both ways.

The tensor names are the BERT family's table (:mod:`attnlab.checkpoints.encoders.bert`).
Every setting attnlab cannot reproduce is collected and reported at once in an
:class:`UnsupportedCheckpointError`.
"""

from __future__ import annotations

from typing import Any, Iterable

from ...layers.encoder_config import EncoderConfig
from ..errors import UnsupportedCheckpointError

__all__ = [
    "UnsupportedCheckpointError",
    "BERT_STYLE_OPTIONS",
    "encoder_config_from_bert",
    "bert_config_from_encoder",
]


# The EncoderConfig options that make attnlab's encoder compute what BERT computes.
BERT_STYLE_OPTIONS: dict[str, Any] = {
    "norm_first": False,
    "position": "learned",
    "embedding_norm": True,
    "final_norm": False,
    "scale_embeddings": False,
    "bias": True,
    "attention": "dense",
}

# HF `hidden_act` -> attnlab activation name. "gelu" in HF is the exact erf GELU.
_ACTIVATIONS_FROM_BERT = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_ACTIVATIONS_TO_BERT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}

def _problems_error(what: str, problems: Iterable[str]) -> UnsupportedCheckpointError:
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return UnsupportedCheckpointError(f"{what}:\n{lines}")


def encoder_config_from_bert(values: dict[str, Any], *, source: str = "config.json") -> EncoderConfig:
    """Translate a BERT ``config.json`` into an :class:`EncoderConfig`.

    Raises:
        UnsupportedCheckpointError: listing every setting attnlab cannot reproduce.
    """
    problems = []
    model_type = values.get("model_type")
    if model_type != "bert":
        architectures = values.get("architectures")
        problems.append(f"model_type is {model_type!r} (architectures {architectures}); only 'bert' is supported")
    position_type = values.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        problems.append(f"position_embedding_type is {position_type!r}; only 'absolute' is supported")
    if values.get("is_decoder") or values.get("add_cross_attention"):
        problems.append("is_decoder/add_cross_attention is set; only the bidirectional encoder is supported")
    hidden_act = values.get("hidden_act", "gelu")
    if hidden_act not in _ACTIVATIONS_FROM_BERT:
        problems.append(f"hidden_act is {hidden_act!r}; supported: {sorted(_ACTIVATIONS_FROM_BERT)}")
    required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [key for key in required if key not in values]
    if missing:
        problems.append(f"missing keys {missing}")
    if problems:
        raise _problems_error(f"{source} does not describe a supported BERT encoder", problems)
    hidden_dropout = float(values.get("hidden_dropout_prob", 0.1))
    attention_dropout = float(values.get("attention_probs_dropout_prob", hidden_dropout))
    try:
        return EncoderConfig(
            vocab_size=values["vocab_size"],
            d_model=values["hidden_size"],
            num_layers=values["num_hidden_layers"],
            num_heads=values["num_attention_heads"],
            d_ff=values["intermediate_size"],
            dropout=hidden_dropout,
            max_len=values.get("max_position_embeddings", 512),
            # None means "same as dropout", so a saved and reloaded config compares equal.
            attention_dropout=None if attention_dropout == hidden_dropout else attention_dropout,
            pad_id=values.get("pad_token_id"),
            activation=_ACTIVATIONS_FROM_BERT[hidden_act],
            layer_norm_eps=float(values.get("layer_norm_eps", 1e-12)),
            type_vocab_size=values.get("type_vocab_size", 2),
            **BERT_STYLE_OPTIONS,
        )
    except ValueError as error:
        raise UnsupportedCheckpointError(f"{source} holds values attnlab cannot use: {error}") from error


def bert_config_from_encoder(config: EncoderConfig) -> dict[str, Any]:
    """The BERT ``config.json`` dict for an encoder built with BERT-style options.

    A ``type_vocab_size`` of 0 is written as 1 (with a zero embedding, see
    :func:`encoder_state_to_bert`), since BERT always adds a token-type embedding.

    Raises:
        UnsupportedCheckpointError: listing every option BERT cannot express.
    """
    problems = [
        f"{name}={getattr(config, name)!r} (BERT needs {want!r})"
        for name, want in BERT_STYLE_OPTIONS.items()
        if getattr(config, name) != want
    ]
    if problems:
        raise _problems_error(
            "this encoder cannot be written in the BERT layout; build it with "
            "attnlab.checkpoints.encoders.loading.bert_style_config(...) or these options",
            problems,
        )
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.d_ff,
        "hidden_act": _ACTIVATIONS_TO_BERT[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": config.effective_attention_dropout,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": max(config.type_vocab_size, 1),
        "initializer_range": 0.02,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_id,
        "position_embedding_type": "absolute",
        "is_decoder": False,
        "add_cross_attention": False,
    }
