"""BERT (and MiniLM, which is a BERT): the table every BERT-like family starts from."""

from __future__ import annotations

from typing import Any, Optional

from ...layers import TransformerEncoder
from ._bert_layout import bert_config_from_encoder, encoder_config_from_bert
from ._bert_like import ACTIVATIONS_FROM_HF
from .._table import ClassifierTable, Family, MaskedLMTable

__all__ = ["BERT", "BERT_EMBEDDINGS", "BERT_LAYER", "BERT_QKV", "hidden_act_head"]

BERT_EMBEDDINGS = {
    "embedding": "embeddings.word_embeddings",
    "pos_encoding.embedding": "embeddings.position_embeddings",
    "token_type_embedding": "embeddings.token_type_embeddings",
    "embedding_norm": "embeddings.LayerNorm",
}
BERT_LAYER = {
    "self_attn.out_proj": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "ffn.linear1": "intermediate.dense",
    "ffn.linear2": "output.dense",
    "norm2": "output.LayerNorm",
}
BERT_QKV = ("attention.self.query", "attention.self.key", "attention.self.value")


def hidden_act_head(values: dict[str, Any]) -> dict[str, Any]:
    """A masked-LM head whose activation is the encoder's (``hidden_act``)."""
    return {"activation": ACTIVATIONS_FROM_HF.get(values.get("hidden_act", "gelu"), "gelu")}


def _config_to_hf(encoder: TransformerEncoder, original: Optional[dict[str, Any]]) -> dict[str, Any]:
    return bert_config_from_encoder(encoder.config)


BERT = Family(
    name="bert",
    model_types=("bert",),
    architecture="BertModel",
    base_prefix="bert.",
    config_from_hf=lambda values, source: encoder_config_from_bert(values, source=source),
    config_to_hf=_config_to_hf,
    embeddings=BERT_EMBEDDINGS,
    layer_prefix="encoder.layer.{}.",
    layer=BERT_LAYER,
    qkv=BERT_QKV,
    classifier=ClassifierTable("BertForSequenceClassification", "classifier", pooler="bert.pooler.dense"),
    masked_lm=MaskedLMTable(
        "BertForMaskedLM",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        decoder="cls.predictions.decoder",
        settings=hidden_act_head,
    ),
)
