"""DistilBERT: its own names and config keys, no token types, LayerNorm epsilon fixed at 1e-12."""

from __future__ import annotations

from typing import Any

from ...layers import EncoderConfig
from ._bert_like import ACTIVATIONS_FROM_HF, read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable

__all__ = ["DISTILBERT"]

_KEYS = {
    "vocab_size": "vocab_size",
    "d_model": "dim",
    "num_layers": "n_layers",
    "num_heads": "n_heads",
    "d_ff": "hidden_dim",
    "dropout": "dropout",
    "attention_dropout": "attention_dropout",
    "max_len": "max_position_embeddings",
    "activation": "activation",
    "pad_id": "pad_token_id",
}


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    return read_config(
        values,
        source,
        family="distilbert",
        keys=_KEYS,
        defaults={"pad_id": 0},
        fixed={"layer_norm_eps": 1e-12, "type_vocab_size": 0},
    )


DISTILBERT = Family(
    name="distilbert",
    model_types=("distilbert",),
    architecture="DistilBertModel",
    base_prefix="distilbert.",
    config_from_hf=_read,
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="distilbert", keys=_KEYS),
    embeddings={
        "embedding": "embeddings.word_embeddings",
        "pos_encoding.embedding": "embeddings.position_embeddings",
        "embedding_norm": "embeddings.LayerNorm",
    },
    layer_prefix="transformer.layer.{}.",
    layer={
        "self_attn.out_proj": "attention.out_lin",
        "norm1": "sa_layer_norm",
        "ffn.linear1": "ffn.lin1",
        "ffn.linear2": "ffn.lin2",
        "norm2": "output_layer_norm",
    },
    qkv=("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    classifier=ClassifierTable(
        "DistilBertForSequenceClassification", "classifier", pooler="pre_classifier", activation="relu"
    ),
    masked_lm=MaskedLMTable(
        "DistilBertForMaskedLM",
        "vocab_transform",
        "vocab_layer_norm",
        "vocab_projector.bias",
        decoder="vocab_projector",
        settings=lambda values: {
            "activation": ACTIVATIONS_FROM_HF.get(values.get("activation", "gelu"), "gelu")
        },
    ),
)
