"""ELECTRA: BERT's layout with embeddings narrower than the model, projected up."""

from __future__ import annotations

from typing import Any

from ...layers import EncoderConfig
from ._bert_like import BERT_KEYS, read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable
from .bert import BERT_EMBEDDINGS, BERT_LAYER, BERT_QKV

__all__ = ["ELECTRA", "factorised_embeddings"]


def factorised_embeddings(values: dict[str, Any], config: EncoderConfig) -> dict[str, Any]:
    """The block spec: embedding tables ``embedding_size`` wide, a Linear up to ``hidden_size``."""
    width = values.get("embedding_size", config.d_model)
    return {"embedding_dim": width} if width != config.d_model else {}


ELECTRA = Family(
    name="electra",
    model_types=("electra",),
    architecture="ElectraModel",
    base_prefix="electra.",
    config_from_hf=lambda values, source: read_config(values, source, family="electra"),
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="electra", keys=BERT_KEYS),
    embeddings={**BERT_EMBEDDINGS, "embedding_projection": "embeddings_project"},
    layer_prefix="encoder.layer.{}.",
    layer=BERT_LAYER,
    qkv=BERT_QKV,
    components=factorised_embeddings,
    # ElectraForPreTraining (the released discriminators) adds a head the encoder does not use.
    ignored=("embeddings.position_ids", "embeddings.token_type_ids", "discriminator_predictions."),
    classifier=ClassifierTable(
        "ElectraForSequenceClassification",
        "classifier.out_proj",
        pooler="classifier.dense",
        activation="gelu",
    ),
    # ElectraForMaskedLM is the generator: its head maps back to the embedding width.
    masked_lm=MaskedLMTable(
        "ElectraForMaskedLM",
        "generator_predictions.dense",
        "generator_predictions.LayerNorm",
        "generator_lm_head.bias",
        decoder="generator_lm_head",
    ),
)
