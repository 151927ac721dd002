"""AttnLRP's backward rules (Achtibat et al., ICML 2024), switched on a model for a block.

Dimension letters: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head dim, ``E`` width.

AttnLRP is gradient x input on a model whose backward pass is changed, never its forward
values (the authors' "efficient" implementation, the ``lxt`` package):

* **identity rule** on element-wise non-linearities (SiLU, GELU, tanh): the gradient is
  ``f(x) / x`` times the upstream one, as if ``f`` were the line through 0 and ``(x, f(x))``;
* **uniform rule** on a product of two signals: the gated MLP's ``act(gate) * up`` passes
  half of its gradient on (each factor gets half of the relevance);
* **attention**: the gradients of the queries and keys are divided by 4 and the values' by 2
  where they arrive at the attention function (the softmax's gradient x input is its own
  rule; ``A V`` and ``Q K^T`` split their relevance evenly between their factors);
* **norms** (RMSNorm, LayerNorm): the statistic ``1 / sqrt(var + eps)`` counts as a constant
  (identity rule on the normalisation);
* dropout off: the model runs in eval mode inside the block.

:func:`attn_lrp_rules` switches a model for the length of a block, instance by instance:
each norm and feed-forward net gets a forward of the same values with the rules attached
(an attribute of the instance, removed in ``finally``), and each attention module an input
rule (:func:`~attnlab.attention.interface.set_input_rule`) that both attnlab's attention
functions and the transformers backend apply. A module the rules do not know (an unknown
norm, feed-forward net or activation, attention that does not go through attnlab's
function) is refused by name before anything changes: a silently wrong relevance is worse
than none. attnlab's own modules are known here; transformers' by the table of
:mod:`attnlab.hf.attn_lrp_rules`, which the inspection protocol's registry of doors opens by
name (:func:`~attnlab.inspect.compute.inspectable.door_rules`: this floor imports no transformers).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...attention.interface import calls_attention_function, set_input_rule
from ...attention.multihead import MultiHeadAttention
from ...attention.rotary import RotaryEmbedding, ScaledRotary
from ...layers.causal_attention import CausalSelfAttention
from ...layers.decoder_layer import DecoderLayer
from ...layers.encoder_layer import TransformerEncoderLayer
from ...layers.ffn import GatedFFN, PositionWiseFFN, SwiGLUFFN
from ...layers.positional import LearnedPositionalEmbedding, PositionalEncoding
from ...layers.rms_norm import RMSNorm
from ...models.classifier import POOLER_ACTIVATIONS, DensePooler, EncoderClassifier
from ...models.decoder.causal_lm import DecoderForCausalLM
from ...models.encoder import TransformerEncoder
from .inspectable import door_rules, inspectable
from .modes import eval_mode

__all__ = ["PASS", "attn_lrp_rules", "attention_rule", "divide_gradient", "identity_rule", "layer_norm_rule",
           "refusal", "rule_for"]

# What a module whose forward needs no rule is given: linear maps, embeddings, containers.
PASS = "pass"


class _IdentityRule(torch.autograd.Function):
    """``f(x)`` forward; ``f(x) / (x + eps) * upstream`` backward (lxt's ``identity_rule_implicit``)."""

    @staticmethod
    def forward(ctx, function: Callable[[Tensor], Tensor], x: Tensor, eps: float) -> Tensor:
        output = function(x)
        if x.requires_grad:
            ctx.save_for_backward(output / (x + eps))
        return output

    @staticmethod
    def backward(ctx, upstream: Tensor):
        (slope,) = ctx.saved_tensors
        return None, slope * upstream, None


class _DivideGradient(torch.autograd.Function):
    """The identity forward; the gradient divided by ``factor`` backward (the uniform rule)."""

    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, upstream: Tensor):
        return upstream / ctx.factor, None


def identity_rule(function: Callable[[Tensor], Tensor], x: Tensor, eps: float = 1e-10) -> Tensor:
    """``function(x)`` (element-wise), whose backward is AttnLRP's identity rule.

    Shape:
        any -> the same.
    """
    return _IdentityRule.apply(function, x, eps)


def divide_gradient(x: Tensor, factor: float = 2.0) -> Tensor:
    """``x`` itself, whose gradient is divided by ``factor`` (AttnLRP's uniform rule)."""
    return _DivideGradient.apply(x, factor)


def attention_rule(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The attention function's inputs, their gradients divided by 4, 4 and 2: ``Q K^T`` and
    ``A V`` split their relevance evenly between their factors."""
    return divide_gradient(query, 4.0), divide_gradient(key, 4.0), divide_gradient(value, 2.0)


class _LayerNormRule(torch.autograd.Function):
    """``F.layer_norm`` forward (the module's own values); backward as if ``sqrt(var + eps)``
    were a constant: the gradient of ``(x - mean(x)) / std * w``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float,
                shape: tuple[int, ...]) -> Tensor:
        dims = tuple(range(-len(shape), 0))
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        std = (wide.var(dims, unbiased=False, keepdim=True) + eps).sqrt()
        ctx.save_for_backward(std, weight)
        ctx.dims, ctx.dtype = dims, x.dtype
        return F.layer_norm(x, shape, weight, bias, eps)

    @staticmethod
    def backward(ctx, upstream: Tensor):
        std, weight = ctx.saved_tensors
        upstream = upstream.to(std.dtype)
        scaled = upstream if weight is None else upstream * weight.to(std.dtype)
        centred = scaled - scaled.mean(ctx.dims, keepdim=True)  # the mean's own share
        return (centred / std).to(ctx.dtype), None, None, None, None


def layer_norm_rule(module: nn.LayerNorm, x: Tensor) -> Tensor:
    """``nn.LayerNorm``'s forward, the standard deviation a constant in the backward."""
    return _LayerNormRule.apply(x, module.weight, module.bias, module.eps, tuple(module.normalized_shape))


def _rms_norm(module: RMSNorm, x: Tensor) -> Tensor:
    """:class:`RMSNorm`'s forward with ``rsqrt(mean(x^2) + eps)`` a constant in the backward."""
    input_dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + module.eps).detach()
    return module.weight * x32.to(input_dtype)


def _swiglu(module: SwiGLUFFN, x: Tensor) -> Tensor:
    gated = identity_rule(module.activation, module.gate_proj(x)) * module.up_proj(x)
    return module.down_proj(divide_gradient(gated, 2.0))


def _gated(module: GatedFFN, x: Tensor) -> Tensor:
    value, gate = module.linear1(x).chunk(2, dim=-1)  # each [..., d_ff]
    gated = identity_rule(module.activation, value) * gate
    return module.linear2(module.dropout(divide_gradient(gated, 2.0)))


def _position_wise(module: PositionWiseFFN, x: Tensor) -> Tensor:
    hidden = identity_rule(module.activation, module.linear1(x))
    return module.dropout2(module.linear2(module.dropout1(hidden)))


def _dense_pooler(module: DensePooler, x: Tensor) -> Tensor:
    x = identity_rule(POOLER_ACTIVATIONS[module.settings["activation"]], module.dense(x))
    return x if module.norm is None else module.norm(x)


Rule = Callable[[nn.Module, Tensor], Tensor]

# attnlab's own modules (and torch's) by exact class: a rule, or PASS.
_OWN: dict[type, Any] = {
    RMSNorm: _rms_norm,
    nn.LayerNorm: layer_norm_rule,
    SwiGLUFFN: _swiglu,
    GatedFFN: _gated,
    PositionWiseFFN: _position_wise,
    DensePooler: _dense_pooler,
    **dict.fromkeys((DecoderForCausalLM, DecoderLayer, CausalSelfAttention, ScaledRotary, EncoderClassifier,
                     TransformerEncoder, TransformerEncoderLayer, MultiHeadAttention, RotaryEmbedding,
                     PositionalEncoding, LearnedPositionalEmbedding, nn.ModuleList, nn.Identity), PASS),
}
# Linear maps, embeddings and dropout (off in eval mode) pass, subclasses included.
_PASSING_BASES = (nn.Linear, nn.Embedding, nn.Dropout)


def rule_for(module: nn.Module) -> Any:
    """The rule of one module: a function ``(module, x) -> output``, :data:`PASS`, or ``None``
    for a module the rules do not know."""
    known = _OWN.get(type(module))
    if known is not None:
        return known
    if isinstance(module, _PASSING_BASES):
        return PASS
    table = door_rules(type(module).__module__)
    return None if table is None else table.rule_for(module)


def _plan(model: nn.Module) -> tuple[dict[nn.Module, Rule], list[nn.Module]]:
    """Each module's rule and the attention modules to give the input rule; refuses what is unknown."""
    sites = [site.module for site in inspectable(model).attention_sites()]
    for module in sites:
        if not calls_attention_function(module):
            raise ValueError(f"attn-lrp: {type(module).__name__} does not run attnlab's attention function, "
                             f"where AttnLRP's attention rule is applied; open the model through attnlab")
    parents = {child: parent for parent in model.modules() for child in parent.children()}
    rules: dict[nn.Module, Rule] = {}
    for path, module in model.named_modules():  # the attention modules too: a known kind passes
        rule = rule_for(module)
        if rule is None and _is_activation(module) and callable(rule_for(parents.get(module, model))):
            continue  # an activation module its feed-forward net's rule calls through the identity rule
        if rule is None:
            raise ValueError(
                f"attn-lrp: no AttnLRP rule for {type(module).__name__} (at {path or 'the model'}); it knows "
                f"attnlab's own layers and transformers' {', '.join(_families())} families")
        if callable(rule):
            rules[module] = rule
    return rules, sites


def _is_activation(module: nn.Module) -> bool:
    """An element-wise activation module (torch's or transformers')."""
    name = type(module).__module__
    return name.startswith("torch.nn.modules.activation") or name == "transformers.activations"


def _families() -> list[str]:
    try:
        return list(door_rules("transformers.").FAMILIES)
    except ImportError:
        return []


def refusal(model: nn.Module) -> Optional[str]:
    """Why AttnLRP cannot explain ``model`` (one line), or ``None`` when every module has a rule."""
    try:
        _plan(model)
    except (ValueError, TypeError) as error:
        return str(error)
    return None


@contextlib.contextmanager
def attn_lrp_rules(model: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, ``model``'s backward pass follows AttnLRP's rules; its forward values
    stay what they were (the model runs in eval mode, dropout off).

    Args:
        model: attnlab's decoder or classifier, or a transformers model served by attnlab's
            attention function (a :class:`~attnlab.hf.opening.TransformersModel`, or a bare
            transformers model of a known family, which becomes served).

    Raises:
        ValueError: a module the rules do not know (named), before anything changes.

    Example:
        >>> with attn_lrp_rules(model):
        ...     embeddings = model.embed_tokens(ids).detach().requires_grad_()
        ...     ...  # forward from the embeddings, then logit.backward(): relevance = x * x.grad
    """
    rules, sites = _plan(model)
    replaced: list[tuple[nn.Module, Any]] = []
    with eval_mode(model):
        try:
            for module, rule in rules.items():
                replaced.append((module, module.__dict__.get("forward")))
                module.forward = functools.partial(rule, module)
            for module in sites:
                set_input_rule(module, attention_rule)
            yield model
        finally:
            for module in sites:
                set_input_rule(module, None)
            for module, own in reversed(replaced):
                if own is None:
                    module.__dict__.pop("forward", None)
                else:
                    module.forward = own
