"""DeBERTa-v2 and -v3: BERT's post-norm layer with disentangled attention.

The block spec is a layer factory giving each layer a
:class:`~attnlab.attention.disentangled.DisentangledSelfAttention`; the relative-position
table (and its LayerNorm) is shared by every layer and stored once, under layer 1's
attention. Supported: the usual v2/v3 settings (``relative_attention``, buckets,
``share_att_key`` or separate position projections, ``norm_rel_ebd`` ``layer_norm`` or
``none``, with or without absolute positions). Not supported: a convolution after layer
1 (``conv_kernel_size > 0``) and embeddings narrower than the model.
"""

from __future__ import annotations

from typing import Any

from ...attention.disentangled import POSITION_TERMS, DisentangledSelfAttention, RelativePositionTable
from ...layers import EncoderConfig, TransformerEncoderLayer
from ._bert_like import ACTIVATIONS_FROM_HF, read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable
from .bert import BERT_EMBEDDINGS, BERT_LAYER, hidden_act_head

__all__ = ["DEBERTA_V2", "position_terms"]


def position_terms(values: dict[str, Any]) -> tuple[str, ...]:
    """``pos_att_type`` as a tuple (older configs write ``"p2c|c2p"``)."""
    terms = values.get("pos_att_type") or ()
    if isinstance(terms, str):
        terms = [term.strip() for term in terms.lower().split("|") if term.strip()]
    return tuple(terms) if values.get("relative_attention", False) else ()


def _span(values: dict[str, Any]) -> tuple[int, int, int]:
    """``(span, bucket_size, max_position)`` of the relative-position table."""
    max_position = values.get("max_relative_positions", -1)
    if max_position < 1:
        max_position = values.get("max_position_embeddings", 512)
    buckets = values.get("position_buckets", -1)
    return (buckets if buckets > 0 else max_position), buckets, max_position


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    problems = []
    if values.get("conv_kernel_size", 0) > 0:
        problems.append(
            f"conv_kernel_size is {values['conv_kernel_size']}; only 0 (no convolution) is supported"
        )
    width = values.get("embedding_size", values.get("hidden_size"))
    if width != values.get("hidden_size"):
        problems.append(f"embedding_size is {width}, not hidden_size; only equal sizes are supported")
    if values.get("attention_head_size") not in (
        None,
        values.get("hidden_size", 0) // values.get("num_attention_heads", 1),
    ):
        problems.append(f"attention_head_size is {values['attention_head_size']}; only hidden_size / heads")
    unknown = sorted(set(position_terms(values)) - set(POSITION_TERMS))
    if unknown:
        problems.append(f"pos_att_type holds {unknown}; supported: {list(POSITION_TERMS)}")
    return read_config(
        values,
        source,
        family="deberta-v2",
        problems=problems,
        defaults={"type_vocab_size": 0, "layer_norm_eps": 1e-7, "pad_id": 0},
        fixed={"position": "learned" if values.get("position_biased_input", True) else "none"},
    )


def _components(values: dict[str, Any], config: EncoderConfig) -> dict[str, Any]:
    terms = position_terms(values)
    span, buckets, max_position = _span(values)
    normed = "layer_norm" in str(values.get("norm_rel_ebd", "none")).lower()
    table = RelativePositionTable(
        span,
        config.d_model,
        norm_eps=config.layer_norm_eps if normed else None,
        bucket_size=buckets,
        max_position=max_position,
    )
    share = bool(values.get("share_att_key", False))

    def layer(index: int) -> TransformerEncoderLayer:
        attention = DisentangledSelfAttention(
            config.d_model,
            config.num_heads,
            config.effective_attention_dropout,
            positions=table,
            owns_positions=index == 0,
            terms=terms,
            share_projections=share,
        )
        return TransformerEncoderLayer(
            config.d_model,
            config.num_heads,
            config.d_ff,
            config.dropout,
            activation=config.activation,
            layer_norm_eps=config.layer_norm_eps,
            self_attention=attention,
        )

    return {"layer_factory": layer}


DEBERTA_V2 = Family(
    name="deberta-v2",
    model_types=("deberta-v2",),
    architecture="DebertaV2Model",
    base_prefix="deberta.",
    config_from_hf=_read,
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="deberta-v2"),
    embeddings={
        **BERT_EMBEDDINGS,
        "layers.0.self_attn.positions.embedding": "encoder.rel_embeddings",
        "layers.0.self_attn.positions.norm": "encoder.LayerNorm",
    },
    layer_prefix="encoder.layer.{}.",
    layer={
        **BERT_LAYER,
        "self_attn.pos_key_proj": "attention.self.pos_key_proj",
        "self_attn.pos_query_proj": "attention.self.pos_query_proj",
    },
    qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
    components=_components,
    # The pooler of DebertaV2ForSequenceClassification sits outside the base model.
    classifier=ClassifierTable(
        "DebertaV2ForSequenceClassification",
        "classifier",
        pooler="pooler.dense",
        from_config=lambda values: {
            "activation": ACTIVATIONS_FROM_HF.get(values.get("pooler_hidden_act", "gelu"), "gelu")
        },
    ),
    # The legacy head (HF's default, config.legacy=True) is BERT's; the newer one is not read yet.
    masked_lm=MaskedLMTable(
        "DebertaV2ForMaskedLM",
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.bias",
        decoder="cls.predictions.decoder",
        settings=hidden_act_head,
    ),
)
