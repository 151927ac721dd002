"""ALBERT: factorised embeddings and one layer's weights shared by every layer.

attnlab builds ``num_hidden_layers`` layer modules whose parameters are the same
``Parameter`` objects (one set per hidden group), so each call is its own module:
``capture_attention``, head masks and ``output_attentions`` see one entry per layer, as
HuggingFace's ``attentions`` do, while training updates the one shared set.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ...layers import EncoderConfig
from ...models.encoder import TransformerEncoder
from ._bert_like import read_config, write_config
from .._table import ClassifierTable, Family, MaskedLMTable
from .bert import BERT_EMBEDDINGS, hidden_act_head

__all__ = ["ALBERT", "share_layer_parameters"]


def _group(values: dict[str, Any], index: int) -> int:
    """HuggingFace's group of layer ``index``: ``int(index / (layers / groups))``."""
    layers, groups = values["num_hidden_layers"], values.get("num_hidden_groups", 1)
    return int(index / (layers / groups))


def share_layer_parameters(encoder: TransformerEncoder, source_of: list[int]) -> None:
    """Make layer ``i`` use the very parameters of layer ``source_of[i]``."""
    for index, source in enumerate(source_of):
        if source == index:
            continue
        owner = dict(encoder.layers[source].named_parameters())
        for name, _ in list(encoder.layers[index].named_parameters()):
            path, _, leaf = name.rpartition(".")
            module: nn.Module = encoder.layers[index].get_submodule(path) if path else encoder.layers[index]
            setattr(module, leaf, owner[name])


def _tie(encoder: TransformerEncoder, values: dict[str, Any]) -> None:
    firsts: dict[int, int] = {}
    source_of = [firsts.setdefault(_group(values, index), index) for index in range(len(encoder.layers))]
    share_layer_parameters(encoder, source_of)


def _read(values: dict[str, Any], source: str) -> EncoderConfig:
    problems = []
    if values.get("inner_group_num", 1) != 1:
        problems.append(f"inner_group_num is {values['inner_group_num']}; only 1 is supported")
    groups = values.get("num_hidden_groups", 1)
    if not isinstance(groups, int) or groups < 1:
        problems.append(f"num_hidden_groups is {groups!r}; expected an int >= 1")
    return read_config(
        values, source, family="albert", defaults={"activation": "gelu_new", "pad_id": 0}, problems=problems
    )


ALBERT = Family(
    name="albert",
    model_types=("albert",),
    architecture="AlbertModel",
    base_prefix="albert.",
    config_from_hf=_read,
    config_to_hf=lambda encoder, original: write_config(encoder, original, family="albert"),
    embeddings={**BERT_EMBEDDINGS, "embedding_projection": "encoder.embedding_hidden_mapping_in"},
    layer_prefix="encoder.albert_layer_groups.{}.albert_layers.0.",
    layer={
        "self_attn.out_proj": "attention.dense",
        "norm1": "attention.LayerNorm",
        "ffn.linear1": "ffn",
        "ffn.linear2": "ffn_output",
        "norm2": "full_layer_layer_norm",
    },
    qkv=("attention.query", "attention.key", "attention.value"),
    components=lambda values, config: {"embedding_dim": values.get("embedding_size", 128)},
    hf_layer=_group,
    after_load=_tie,
    classifier=ClassifierTable("AlbertForSequenceClassification", "classifier", pooler="albert.pooler"),
    masked_lm=MaskedLMTable(
        "AlbertForMaskedLM",
        "predictions.dense",
        "predictions.LayerNorm",
        "predictions.bias",
        decoder="predictions.decoder",
        settings=lambda values: hidden_act_head({"hidden_act": "gelu_new", **values}),
    ),
)
