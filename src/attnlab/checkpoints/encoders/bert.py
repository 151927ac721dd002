"""BERT (and MiniLM, which is a BERT): the table every BERT-like family starts from.

Its ``config.json`` is read by the BERT-like families' one reader (:func:`._bert_like.read_config`);
any encoder built with BERT's options (``POST_NORM``) is written as a fresh BERT config.
"""

from __future__ import annotations

from typing import Any, Optional

from ...layers import EncoderConfig
from ...models.encoder import TransformerEncoder
from ..errors import problems_error
from ._bert_like import ACTIVATIONS_FROM_HF, ACTIVATIONS_TO_HF, POST_NORM, read_config
from .._table import ClassifierTable, Family, MaskedLMTable

__all__ = ["BERT", "BERT_EMBEDDINGS", "BERT_LAYER", "BERT_QKV", "bert_config_from_encoder", "hidden_act_head"]

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


def bert_config_from_encoder(config: EncoderConfig) -> dict[str, Any]:
    """The BERT ``config.json`` dict for an encoder built with BERT-style options.

    A ``type_vocab_size`` of 0 is written as 1 (with a zero embedding, see
    the converter), since BERT always adds a token-type embedding.

    Raises:
        UnsupportedCheckpointError: listing every option BERT cannot express.
    """
    problems = [
        f"{name}={getattr(config, name)!r} (BERT needs {want!r})"
        for name, want in POST_NORM.items()
        if getattr(config, name) != want
    ]
    if problems:
        raise problems_error(
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
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
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


def _config_to_hf(encoder: TransformerEncoder, original: Optional[dict[str, Any]]) -> dict[str, Any]:
    return bert_config_from_encoder(encoder.config)


BERT = Family(
    name="bert",
    model_types=("bert",),
    architecture="BertModel",
    base_prefix="bert.",
    config_from_hf=lambda values, source: read_config(values, source, family="BERT"),
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
