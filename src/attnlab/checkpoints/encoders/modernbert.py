"""ModernBERT: pre-norm, packed QKV, GeGLU, bias-free norms, rotary positions with one
base on global layers and another on local (sliding-window) layers, no norm before
layer 0's attention.

The block spec is a layer factory: each layer gets a
:class:`~attnlab.MultiHeadAttention` with its own rotary base (and window on local
layers), a :class:`~attnlab.layers.ffn.GatedFFN` and LayerNorms without bias.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from ...attention.multihead import MultiHeadAttention
from ...layers import EncoderConfig, GatedFFN, TransformerEncoderLayer
from ...models.encoder import TransformerEncoder
from ._bert_like import ACTIVATIONS_FROM_HF, ACTIVATIONS_TO_HF
from .._table import ClassifierTable, Family, MaskedLMTable
from ..errors import UnsupportedCheckpointError, problems_error

__all__ = ["MODERNBERT", "layer_types", "rope_bases"]

_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
_OLD_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


def layer_types(values: dict[str, Any]) -> list[str]:
    """``"full_attention"`` or ``"sliding_attention"`` per layer (every n-th layer is global)."""
    if values.get("layer_types"):
        return list(values["layer_types"])
    every = values.get("global_attn_every_n_layers", 3)
    return [
        "sliding_attention" if index % every else "full_attention"
        for index in range(values["num_hidden_layers"])
    ]


def rope_bases(values: dict[str, Any]) -> dict[str, float]:
    """The rotary base of each layer type (``rope_parameters``, or the older theta keys)."""
    parameters = values.get("rope_parameters") or {}
    return {
        kind: float(
            (parameters.get(kind) or {}).get("rope_theta", values.get(_OLD_THETA_KEYS[kind], default))
        )
        for kind, default in _THETA.items()
    }


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    problems = []
    required = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"]
    missing = [key for key in required if key not in values]
    if missing:
        problems.append(f"missing keys {missing}")
    activation = values.get("hidden_activation", "gelu")
    if activation not in ACTIVATIONS_FROM_HF:
        problems.append(f"hidden_activation is {activation!r}; supported: {sorted(ACTIVATIONS_FROM_HF)}")
    for kind, parameters in (values.get("rope_parameters") or {}).items():
        if parameters and parameters.get("rope_type", "default") != "default":
            problems.append(
                f"rope_parameters[{kind!r}] has rope_type {parameters['rope_type']!r}; only 'default'"
            )
    if not missing and len(layer_types(values)) != values["num_hidden_layers"]:
        problems.append(
            f"layer_types has {len(layer_types(values))} entries for {values['num_hidden_layers']} layers"
        )
    unknown = sorted(set(layer_types(values)) - set(_THETA)) if not missing else []
    if unknown:
        problems.append(f"layer_types holds {unknown}; supported: {sorted(_THETA)}")
    if problems:
        raise problems_error(f"{source} does not describe a supported modernbert encoder", problems)
    try:
        return EncoderConfig(
            vocab_size=values["vocab_size"],
            d_model=values["hidden_size"],
            num_layers=values["num_hidden_layers"],
            num_heads=values["num_attention_heads"],
            d_ff=values["intermediate_size"],
            dropout=float(values.get("mlp_dropout", 0.0)),
            max_len=values.get("max_position_embeddings", 8192),
            attention_dropout=float(values.get("attention_dropout", 0.0)),
            pad_id=values.get("pad_token_id"),
            norm_first=True,
            activation=ACTIVATIONS_FROM_HF[activation],
            layer_norm_eps=float(values.get("norm_eps", 1e-5)),
            position="rotary",
            type_vocab_size=0,
            scale_embeddings=False,
            embedding_norm=True,
            final_norm=True,
            bias=bool(values.get("attention_bias", False)),
        )
    except ValueError as error:
        raise UnsupportedCheckpointError(f"{source} holds values attnlab cannot use: {error}") from error


def _components(values: dict[str, Any], config: EncoderConfig) -> dict[str, Any]:
    norm_bias = bool(values.get("norm_bias", False))
    mlp_bias = bool(values.get("mlp_bias", False))
    kinds, bases = layer_types(values), rope_bases(values)
    window = values.get("local_attention", 128) // 2  # HF's sliding_window: keys on each side

    def norm(width: int) -> nn.Module:
        return nn.LayerNorm(width, eps=config.layer_norm_eps, bias=norm_bias)

    def layer(index: int) -> TransformerEncoderLayer:
        E, H = config.d_model, config.num_heads
        local = kinds[index] == "sliding_attention"
        attention = MultiHeadAttention(
            E,
            H,
            config.effective_attention_dropout,
            bias=config.bias,
            rotary=True,
            rotary_base=bases[kinds[index]],
            window=window if local else None,
        )
        ffn = GatedFFN(E, config.d_ff, config.dropout, activation=config.activation, bias=mlp_bias)
        block = TransformerEncoderLayer(
            E,
            H,
            config.d_ff,
            config.dropout,
            norm_first=True,
            self_attention=attention,
            ffn=ffn,
            norm_layer=norm,
        )
        if index == 0:
            block.norm1 = nn.Identity()  # the embedding norm comes right before
        return block

    return {"layer_factory": layer, "norm_layer": norm}


def _write(encoder: TransformerEncoder, original: Optional[dict[str, Any]]) -> dict[str, Any]:
    if original is None:
        raise UnsupportedCheckpointError(
            "this encoder was not opened from a modernbert checkpoint, so its modernbert config is unknown; "
            "open one with attnlab.from_pretrained(dir) and save that"
        )
    config = encoder.config
    return {
        **original,
        "mlp_dropout": config.dropout,
        "attention_dropout": config.effective_attention_dropout,
        "hidden_activation": ACTIVATIONS_TO_HF[config.activation],
    }


def _classifier_settings(values: dict[str, Any]) -> dict[str, Any]:
    return {
        "pooling": {"cls": "first", "mean": "mean"}[values.get("classifier_pooling", "cls")],
        "activation": ACTIVATIONS_FROM_HF.get(values.get("classifier_activation", "gelu"), "gelu"),
        "bias": bool(values.get("classifier_bias", False)),
        "norm_eps": float(values.get("norm_eps", 1e-5)),
        "norm_bias": bool(values.get("norm_bias", False)),
    }


def _masked_lm_settings(values: dict[str, Any]) -> dict[str, Any]:
    head = _classifier_settings(values)
    return {"activation": head["activation"], "transform_bias": head["bias"], "norm_bias": head["norm_bias"]}


MODERNBERT = Family(
    name="modernbert",
    model_types=("modernbert",),
    architecture="ModernBertModel",
    base_prefix="model.",
    config_from_hf=_read,
    config_to_hf=_write,
    embeddings={
        "embedding": "embeddings.tok_embeddings",
        "embedding_norm": "embeddings.norm",
        "layer_norm": "final_norm",
    },
    layer_prefix="layers.{}.",
    layer={
        "self_attn.out_proj": "attn.Wo",
        "norm1": "attn_norm",
        "ffn.linear1": "mlp.Wi",
        "ffn.linear2": "mlp.Wo",
        "norm2": "mlp_norm",
    },
    qkv="attn.Wqkv",
    components=_components,
    classifier=ClassifierTable(
        "ModernBertForSequenceClassification",
        "classifier",
        pooler="head.dense",
        pooler_norm="head.norm",
        activation="gelu",
        from_config=_classifier_settings,
    ),
    masked_lm=MaskedLMTable(
        "ModernBertForMaskedLM",
        "head.dense",
        "head.norm",
        "decoder.bias",
        decoder="decoder",
        settings=_masked_lm_settings,
    ),
    ignored=(),
)
