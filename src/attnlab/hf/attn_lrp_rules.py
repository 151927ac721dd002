"""AttnLRP's rules for transformers' modules, family by family (the table
:mod:`attnlab.inspect.compute.attn_lrp_rules` looks up by name).

A family is known when every class of its modeling file that a model holds is listed here:
its norms and feed-forward nets with the rule that replaces their forward for a while (the
same values, AttnLRP's backward), everything else as passing (decoder layers, models, rotary
tables, attention modules: their queries, keys and values get the attention rule where they
reach attnlab's attention function). Any other class is refused by name, so a family whose
modeling file grows a new mechanism is refused rather than explained wrongly. The rules are
those of the ``lxt`` package's maps for the same families (``lxt/efficient/models``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..inspect.compute.attn_lrp_rules import PASS, divide_gradient, identity_rule

__all__ = ["FAMILIES", "rule_for"]


def _llama_rms_norm(module: nn.Module, hidden_states: Tensor) -> Tensor:
    """Llama's RMSNorm (Mistral, Qwen2, Qwen3), ``rsqrt(variance + eps)`` a constant in the backward."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + module.variance_epsilon).detach()
    return module.weight * hidden_states.to(input_dtype)


def _gemma_rms_norm(module: nn.Module, x: Tensor) -> Tensor:
    """Gemma 3's RMSNorm (weights stored as ``w - 1``), the statistic a constant in the backward."""
    x32 = x.float()
    output = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.eps).detach()
    output = output * (1.0 + module.weight.float())
    return output.type_as(x)


def _gated_mlp(module: nn.Module, x: Tensor) -> Tensor:
    """``down(act(gate(x)) * up(x))``: identity rule on ``act``, the product's gradient halved."""
    gated = identity_rule(module.act_fn, module.gate_proj(x)) * module.up_proj(x)
    return module.down_proj(divide_gradient(gated, 2.0))


def _gpt2_mlp(module: nn.Module, hidden_states: Tensor) -> Tensor:
    hidden_states = identity_rule(module.act, module.c_fc(hidden_states))
    return module.dropout(module.c_proj(hidden_states))


def _bert_intermediate(module: nn.Module, hidden_states: Tensor) -> Tensor:
    return identity_rule(module.intermediate_act_fn, module.dense(hidden_states))


def _bert_pooler(module: nn.Module, hidden_states: Tensor) -> Tensor:
    return identity_rule(module.activation, module.dense(hidden_states[:, 0]))


def _decoder_family(prefix: str, norm: Any = _llama_rms_norm) -> dict[str, Any]:
    passing = ("Attention", "DecoderLayer", "Model", "TextModel", "ForCausalLM", "ForSequenceClassification",
               "RotaryEmbedding", "TextScaledWordEmbedding")
    return {f"{prefix}RMSNorm": norm, f"{prefix}MLP": _gated_mlp, **{prefix + name: PASS for name in passing}}


# model_type -> {class name: rule or PASS}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": _decoder_family("Llama"),
    "mistral": _decoder_family("Mistral"),
    "qwen2": _decoder_family("Qwen2"),
    "qwen3": _decoder_family("Qwen3"),
    "gemma3": _decoder_family("Gemma3", _gemma_rms_norm),
    "gpt2": {"GPT2MLP": _gpt2_mlp, **dict.fromkeys(
        ("GPT2Attention", "GPT2Block", "GPT2Model", "GPT2LMHeadModel", "GPT2ForSequenceClassification"),
        PASS)},
    "bert": {"BertIntermediate": _bert_intermediate, "BertPooler": _bert_pooler, **dict.fromkeys(
        ("BertEmbeddings", "BertSelfAttention", "BertSelfOutput", "BertAttention", "BertOutput", "BertLayer",
         "BertEncoder", "BertModel", "BertForSequenceClassification"), PASS)},
}

# Classes shared by every family: transformers' Conv1D (GPT-2's linear map) and attnlab's wrapper.
_SHARED = {("transformers.pytorch_utils", "Conv1D"): PASS, ("attnlab.hf.opening", "TransformersModel"): PASS}

# Settings of a known family that put a non-linearity the rules do not model in its forward.
_REFUSED_SETTINGS = ("final_logit_softcapping", "attn_logit_softcapping")


def rule_for(module: nn.Module) -> Any:
    """A transformers module's rule, :data:`~attnlab.inspect.compute.attn_lrp_rules.PASS`, or
    ``None`` for a class no known family lists (or a known one set up with soft-capping)."""
    cls = type(module)
    shared = _SHARED.get((cls.__module__, cls.__name__))
    if shared is not None:
        return shared
    parts = cls.__module__.split(".")  # transformers.models.<family>.modeling_<family>
    if len(parts) != 4 or parts[:2] != ["transformers", "models"] or parts[3] != f"modeling_{parts[2]}":
        return None
    rule = FAMILIES.get(parts[2], {}).get(cls.__name__)
    config = getattr(module, "config", None)
    if rule is not None and any(getattr(config, name, None) for name in _REFUSED_SETTINGS):
        return None
    return rule
