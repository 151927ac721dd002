"""RoBERTa and XLM-R: BERT's layout with positions counted over real tokens after the pad id."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...layers import EncoderConfig
from ...layers.positional import PaddingOffsetPositionalEmbedding
from ._bert_like import read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable
from .bert import BERT_EMBEDDINGS, BERT_LAYER, BERT_QKV

__all__ = ["ROBERTA", "XLM_ROBERTA", "offset_positions", "offset_max_len"]


def offset_max_len(values: dict[str, Any]) -> dict[str, Any]:
    """``max_len`` fixed to the real tokens the position table can number."""
    table, pad_id = values.get("max_position_embeddings", 514), values.get("pad_token_id", 1)
    return {"max_len": table - pad_id - 1}


def offset_positions(values: dict[str, Any], config: EncoderConfig) -> dict[str, Any]:
    """The block spec: fairseq's position numbering (see PaddingOffsetPositionalEmbedding)."""
    table, pad_id = values.get("max_position_embeddings", 514), values.get("pad_token_id", 1)
    return {"positions": PaddingOffsetPositionalEmbedding(config.d_model, table, pad_id)}


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    return read_config(
        values,
        source,
        family=values.get("model_type", "roberta"),
        defaults={"pad_id": 1, "type_vocab_size": 1, "max_len": 514},
        fixed=offset_max_len(values),
    )


ROBERTA = Family(
    name="roberta",
    model_types=("roberta",),
    architecture="RobertaModel",
    base_prefix="roberta.",
    config_from_hf=_read,
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="roberta"),
    embeddings=BERT_EMBEDDINGS,
    layer_prefix="encoder.layer.{}.",
    layer=BERT_LAYER,
    qkv=BERT_QKV,
    components=offset_positions,
    classifier=ClassifierTable(
        "RobertaForSequenceClassification", "classifier.out_proj", pooler="classifier.dense"
    ),
    masked_lm=MaskedLMTable(
        "RobertaForMaskedLM", "lm_head.dense", "lm_head.layer_norm", "lm_head.bias", decoder="lm_head.decoder"
    ),
)

XLM_ROBERTA = dataclasses.replace(
    ROBERTA,
    name="xlm-roberta",
    model_types=("xlm-roberta",),
    architecture="XLMRobertaModel",
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="xlm-roberta"),
    classifier=dataclasses.replace(ROBERTA.classifier, architecture="XLMRobertaForSequenceClassification"),
    masked_lm=dataclasses.replace(ROBERTA.masked_lm, architecture="XLMRobertaForMaskedLM"),
)
