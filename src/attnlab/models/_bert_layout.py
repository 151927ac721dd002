"""The HuggingFace BERT checkpoint layout and attnlab's encoder, both ways.

Two translations live here, and nothing else:

* configuration: a BERT ``config.json`` dict <-> :class:`~attnlab.EncoderConfig`;
* tensors: BERT tensor names (``encoder.layer.0.attention.self.query.weight``, ...)
  <-> the ``state_dict`` of :class:`~attnlab.TransformerEncoder`
  (``layers.0.self_attn.in_proj_weight``, which packs query, key and value).

Every disagreement (another architecture, a missing or unexpected tensor, a shape
that does not fit) is collected and reported at once in an
:class:`UnsupportedCheckpointError`.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor

from ..layers.encoder_config import EncoderConfig

__all__ = [
    "UnsupportedCheckpointError",
    "BERT_STYLE_OPTIONS",
    "encoder_config_from_bert",
    "bert_config_from_encoder",
    "bert_state_to_encoder",
    "encoder_state_to_bert",
]


class UnsupportedCheckpointError(ValueError):
    """A checkpoint (or a model to export) that does not fit the BERT layout."""


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

# Tensors a BERT checkpoint may carry that the encoder has no use for: the pooler
# (a Linear + tanh on [CLS], not part of the hidden states) and the constant
# position-id buffer older versions saved.
_IGNORED_PREFIXES = ("pooler.",)
_IGNORED_NAMES = ("embeddings.position_ids",)


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
            "attnlab.models.pretrained.bert_style_config(...) or these options",
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


def _bert_layer_names(index: int) -> dict[str, str]:
    """attnlab name -> BERT name for the parameters of layer ``index`` (except Q/K/V)."""
    bert = f"encoder.layer.{index}."
    ours = f"layers.{index}."
    pairs = {
        "self_attn.out_proj": "attention.output.dense",
        "norm1": "attention.output.LayerNorm",
        "ffn.linear1": "intermediate.dense",
        "ffn.linear2": "output.dense",
        "norm2": "output.LayerNorm",
    }
    return {
        f"{ours}{mine}.{kind}": f"{bert}{theirs}.{kind}"
        for mine, theirs in pairs.items()
        for kind in ("weight", "bias")
    }


def _bert_names(config: EncoderConfig) -> dict[str, str]:
    """attnlab name -> BERT name for every one-to-one tensor."""
    names = {
        "embedding.weight": "embeddings.word_embeddings.weight",
        "pos_encoding.embedding.weight": "embeddings.position_embeddings.weight",
        "embedding_norm.weight": "embeddings.LayerNorm.weight",
        "embedding_norm.bias": "embeddings.LayerNorm.bias",
    }
    if config.type_vocab_size:
        names["token_type_embedding.weight"] = "embeddings.token_type_embeddings.weight"
    for index in range(config.num_layers):
        names.update(_bert_layer_names(index))
    return names


def _qkv_names(index: int, kind: str) -> list[str]:
    return [f"encoder.layer.{index}.attention.self.{part}.{kind}" for part in ("query", "key", "value")]


def _expected_bert_shapes(config: EncoderConfig) -> dict[str, tuple[int, ...]]:
    E, F = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config.vocab_size, E),
        "embeddings.position_embeddings.weight": (config.max_len, E),
        "embeddings.LayerNorm.weight": (E,),
        "embeddings.LayerNorm.bias": (E,),
    }
    if config.type_vocab_size:
        shapes["embeddings.token_type_embeddings.weight"] = (config.type_vocab_size, E)
    for index in range(config.num_layers):
        for kind, shape in (("weight", (E, E)), ("bias", (E,))):
            for name in _qkv_names(index, kind):
                shapes[name] = shape
        prefix = f"encoder.layer.{index}."
        shapes.update({
            prefix + "attention.output.dense.weight": (E, E),
            prefix + "attention.output.dense.bias": (E,),
            prefix + "attention.output.LayerNorm.weight": (E,),
            prefix + "attention.output.LayerNorm.bias": (E,),
            prefix + "intermediate.dense.weight": (F, E),
            prefix + "intermediate.dense.bias": (F,),
            prefix + "output.dense.weight": (E, F),
            prefix + "output.dense.bias": (E,),
            prefix + "output.LayerNorm.weight": (E,),
            prefix + "output.LayerNorm.bias": (E,),
        })
    return shapes


def _normalise_bert_name(name: str) -> str:
    """Strip a ``bert.`` prefix (task-model checkpoints) and old ``gamma``/``beta`` names."""
    if name.startswith("bert."):
        name = name[len("bert."):]
    if name.endswith("LayerNorm.gamma"):
        name = name[: -len("gamma")] + "weight"
    elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
    return name


def _ignorable(name: str) -> bool:
    return name in _IGNORED_NAMES or name.startswith(_IGNORED_PREFIXES)


def bert_state_to_encoder(
    tensors: dict[str, Tensor], config: EncoderConfig, *, strict: bool = True, source: str = "checkpoint"
) -> tuple[dict[str, Tensor], list[str]]:
    """Map BERT tensors onto the ``state_dict`` names of a :class:`TransformerEncoder`.

    Args:
        tensors: BERT tensor name -> tensor, as read from ``model.safetensors``.
        config: the encoder the tensors are for (from :func:`encoder_config_from_bert`).
        strict: with ``False``, tensors the encoder has no place for (a task head,
            ``cls.*``) are skipped instead of raising.
        source: where the tensors came from, for error messages.

    Returns:
        ``(state_dict, skipped)``: the encoder's tensors, and the names that were
        present but not used (the pooler, and with ``strict=False`` any extra).

    Raises:
        UnsupportedCheckpointError: listing every missing tensor, unexpected tensor
            and shape mismatch.
    """
    given = {_normalise_bert_name(name): tensor for name, tensor in tensors.items()}
    expected = _expected_bert_shapes(config)
    missing = sorted(set(expected) - set(given))
    extra = sorted(name for name in set(given) - set(expected) if not _ignorable(name))
    skipped = sorted(name for name in set(given) - set(expected) if _ignorable(name))
    mismatched = [
        f"{name}: checkpoint {tuple(given[name].shape)}, config expects {shape}"
        for name, shape in expected.items()
        if name in given and tuple(given[name].shape) != shape
    ]
    problems = [f"missing tensor {name}" for name in missing]
    if strict:
        problems += [f"unexpected tensor {name}" for name in extra]
    else:
        skipped += extra
    problems += [f"shape mismatch {line}" for line in mismatched]
    if problems:
        hint = " (pass strict=False to skip unexpected tensors)" if strict and extra else ""
        raise _problems_error(f"{source} does not match a BERT encoder of this config{hint}", problems)

    state = {ours: given[theirs] for ours, theirs in _bert_names(config).items()}
    for index in range(config.num_layers):
        prefix = f"layers.{index}.self_attn."
        state[prefix + "in_proj_weight"] = torch.cat([given[n] for n in _qkv_names(index, "weight")])  # [3E, E]
        state[prefix + "in_proj_bias"] = torch.cat([given[n] for n in _qkv_names(index, "bias")])  # [3E]
    return state, skipped


def encoder_state_to_bert(state: dict[str, Tensor], config: EncoderConfig) -> dict[str, Tensor]:
    """The BERT tensors of an encoder's ``state_dict`` (contiguous copies, ready to save).

    An encoder without token types gets a ``[1, E]`` zero token-type embedding, which
    adds nothing, so BERT computes the same function.
    """
    tensors = {theirs: state[ours] for ours, theirs in _bert_names(config).items()}
    if not config.type_vocab_size:
        word = state["embedding.weight"]
        tensors["embeddings.token_type_embeddings.weight"] = word.new_zeros(1, config.d_model)
    for index in range(config.num_layers):
        prefix = f"layers.{index}.self_attn."
        for kind in ("weight", "bias"):
            packed = state[f"{prefix}in_proj_{kind}"]  # [3E, E] or [3E]
            for name, part in zip(_qkv_names(index, kind), packed.chunk(3)):
                tensors[name] = part
    return {name: tensor.detach().contiguous().clone() for name, tensor in tensors.items()}
