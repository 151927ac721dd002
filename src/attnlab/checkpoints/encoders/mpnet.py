"""MPNet: RoBERTa's positions plus a relative position bias shared by every layer."""

from __future__ import annotations

from typing import Any

from ...attention.position_bias import RelativePositionBias
from ...layers import EncoderConfig
from ._bert_like import read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable
from .roberta import offset_max_len, offset_positions

__all__ = ["MPNET"]


def _components(values: dict[str, Any], config: EncoderConfig) -> dict[str, Any]:
    # HuggingFace sorts offsets into 32 buckets whatever the table's size.
    bias = RelativePositionBias(config.num_heads, values.get("relative_attention_num_buckets", 32))
    return {**offset_positions(values, config), "score_bias": bias}


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    return read_config(
        values,
        source,
        family="mpnet",
        defaults={"pad_id": 1, "max_len": 514},
        fixed={**offset_max_len(values), "type_vocab_size": 0},
    )


MPNET = Family(
    name="mpnet",
    model_types=("mpnet",),
    architecture="MPNetModel",
    base_prefix="mpnet.",
    config_from_hf=_read,
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="mpnet"),
    embeddings={
        "embedding": "embeddings.word_embeddings",
        "pos_encoding.embedding": "embeddings.position_embeddings",
        "embedding_norm": "embeddings.LayerNorm",
        "score_bias.embedding": "encoder.relative_attention_bias",
    },
    layer_prefix="encoder.layer.{}.",
    layer={
        "self_attn.out_proj": "attention.attn.o",
        "norm1": "attention.LayerNorm",
        "ffn.linear1": "intermediate.dense",
        "ffn.linear2": "output.dense",
        "norm2": "output.LayerNorm",
    },
    qkv=("attention.attn.q", "attention.attn.k", "attention.attn.v"),
    components=_components,
    classifier=ClassifierTable(
        "MPNetForSequenceClassification", "classifier.out_proj", pooler="classifier.dense"
    ),
    masked_lm=MaskedLMTable(
        "MPNetForMaskedLM", "lm_head.dense", "lm_head.layer_norm", "lm_head.bias", decoder="lm_head.decoder"
    ),
)
