"""transformers decoders through attnlab's native decoding step: greedy generation at attnlab's speed.

attnlab's native step (``_native/decode_step.cpp``, see
:mod:`attnlab.models.decoder.native_decoding`) runs a whole decoding step of a pre-norm
decoder in one call. Many transformers families compute exactly that step: Llama,
Mistral (one sliding window on every layer), Qwen2 (query/key/value biases), Phi-3 (fused
query/key/value and gate/up products, split here into views); with the step's optional
pieces, Qwen3 (query/key norms per head), OLMo 2 (query/key norms over all heads, norms
after attention and the feed-forward net instead of before), Gemma 2 and 3 (norms of
the form ``1 + w``, four per layer, scaled embeddings, sliding windows on some layers with
their own rotary angles in Gemma 3, soft-capped scores and logits in Gemma 2). :func:`native_layout`
reads a transformers causal LM by its structure and config (its modules, what its norms
and activation compute on a probe, its rotary type, its windows, its soft-capping) and
gives the kernel's weights, views of the model's own where it can; any mismatch gives a
reason instead, and generation keeps transformers' ``generate``.

The prompt runs through the model's own forward (transformers' attention and masks);
its keys and values are copied into a cache the kernel writes in place, and each new
token is one kernel call. Greedy tokens are transformers' ``generate``'s (to float32
rounding). Asking for the weights keeps transformers' path, where attnlab's attention
function records them.

Dimension letters: ``B`` batch, ``T`` prompt length, ``H`` query heads, ``K`` key/value
heads, ``C`` cache slots, ``D`` head dim, ``E`` model dim, ``V`` vocabulary.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import _native
from .._dispatch import native_unavailable_reason
from .._skinny import MAX_ROWS
from ..attention.interface import head_scale_of
from ..inspect.compute.routing import route_of
from ..models.decoder.generation import GenerationOutput
from ..models.decoder.step_slots import StepSlots

__all__ = ["NativeLayout", "NativeSteps", "native_generate", "native_layout", "unserved_reason"]

_KERNEL = "decode_step"
# The layer wirings the kernel computes, by model_type: every layer is
# x + post_attn(attn(pre_attn(x))), then x + post_ffn(mlp(pre_ffn(x))); the names of those
# four norms in the layer (None: no norm there). The modules themselves are checked by
# structure below.
_PRE_NORM = ("input_layernorm", "post_attention_layernorm", None, None)
_SANDWICH = ("input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm")
_WIRINGS: dict[str, tuple[Optional[str], ...]] = {
    "llama": _PRE_NORM, "mistral": _PRE_NORM, "qwen2": _PRE_NORM, "phi3": _PRE_NORM, "qwen3": _PRE_NORM,
    "olmo2": (None, None, "post_attention_layernorm", "post_feedforward_layernorm"),
    "gemma2": _SANDWICH, "gemma3_text": _SANDWICH,
}
# the kernel's activation codes (decode_step.cpp: Activation), with the function each is
_ACTIVATIONS: dict[int, Callable[[Tensor], Tensor]] = {
    0: F.silu, 1: F.gelu, 2: lambda x: F.gelu(x, approximate="tanh"), 3: F.relu}
# rotary types whose angles depend on the position alone (the model's rotary module computes them)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# transformers installs these hooks once a call asks for attentions or hidden states; they
# record only inside such a call, which never runs the native step
_TRANSFORMERS_CAPTURE = "transformers.utils.output_capturing"
# options of generate the native loop does as transformers' greedy search does
_SERVED_OPTIONS = {"eos_token_id", "pad_token_id", "do_sample"}


@dataclass
class NativeLayout:
    """What the kernel needs of one transformers decoder.

    Attributes:
        weights: per layer the kernel's 14 entries (``decode_step.cpp``: Entry), then the
            final norm's weight and bias and the LM head's weight and bias (``None``: absent).
        scales: each layer's score scale.
        num_heads, num_kv_heads, head_dim: ``H``, ``K``, ``D``.
        eps: the norms' epsilon.
        activation: the kernel's activation code.
        embedding: the input embedding (called as a module: its own scale and hooks run).
        rotary: ``(x, positions) -> (cos, sin)``, the model's rotary angles.
        extras: per layer the kernel's 4 optional entries (``decode_step.cpp``: Extra), or
            empty where no layer has any.
        windows: per layer its sliding window (0: none).
        local_rotary: the angles of the layers with a window, where they have their own.
        attention_softcap, logit_softcap: tanh soft-capping (0: none).
    """

    weights: list[Optional[Tensor]]
    scales: list[float]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    activation: int
    embedding: nn.Module
    rotary: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    extras: list[Optional[Tensor]]
    windows: list[int]
    local_rotary: Optional[Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]] = None
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0


def _probe(width: int) -> Tensor:
    return torch.randn(2, width, generator=torch.Generator().manual_seed(0))  # [2, E]


def _norm_weight(norm: nn.Module, eps: float) -> Union[Tensor, str]:
    """The weight ``w`` with which ``norm(x) = x * rsqrt(mean(x^2) + eps) * w`` (``w`` itself,
    or ``1 + w`` for Gemma's offset form), found by running the norm on a probe."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 1 or getattr(norm, "bias", None) is not None:
        return f"{type(norm).__name__} is not an RMSNorm with one weight"
    x = _probe(weight.shape[0])
    with torch.no_grad():
        got = norm(x)
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        for candidate in (weight, None):
            scale = weight if candidate is not None else 1.0 + weight
            if torch.allclose(got, normed * scale, rtol=1e-5, atol=1e-6):
                return weight if candidate is not None else (1.0 + weight).contiguous()
    return f"{type(norm).__name__} computes something else than an RMSNorm"


def _activation_code(function: Any) -> Optional[int]:
    """The kernel's code of the activation ``function`` computes on a probe, else ``None``."""
    if not callable(function):
        return None
    x = _probe(64) * 3
    with torch.no_grad():
        got = function(x)
        return next((code for code, reference in _ACTIVATIONS.items()
                     if torch.allclose(got, reference(x), rtol=1e-5, atol=1e-6)), None)


def _window_of(attention: nn.Module, config: Any) -> Optional[int]:
    from .opening import _window_of as window_of  # opening imports this module: no import at the top

    return window_of(attention, config)


def _rotaries(config: Any, module: nn.Module, width: int, D: int):
    """``(rotary, local rotary or None)`` angle functions of the model's rotary module, else
    why not: a rope type whose angles depend on more than the position, or angles that do
    not cover the head dim (partial rotary)."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(parameters, Mapping):
        return f"rope parameters of an unknown form ({type(parameters).__name__})"
    per_type = bool(parameters) and all(isinstance(value, Mapping) for value in parameters.values())
    if per_type and set(parameters) - {"full_attention", "sliding_attention"}:
        return f"rotary parameters for layer types {sorted(parameters)}"
    for values in parameters.values() if per_type else [parameters]:
        rope_type = values.get("rope_type", values.get("type", "default"))
        if rope_type not in _STATIC_ROPE:
            return f"rope type {rope_type!r} (the native step takes {', '.join(_STATIC_ROPE)})"
    if per_type:  # Gemma 3: one module, the layer type named in each call
        rotary = lambda x, positions: module(x, positions, "full_attention")  # noqa: E731
        local = lambda x, positions: module(x, positions, "sliding_attention")  # noqa: E731
    else:
        rotary, local = module, None
    with torch.no_grad():
        for angles in (rotary, local) if local is not None else (rotary,):
            try:
                cos, _ = angles(torch.zeros(1, 1, width), torch.zeros(1, 1, dtype=torch.long))
            except Exception as error:  # a rotary module of another signature
                return f"the rotary module cannot be called as (x, positions): {type(error).__name__}"
            if cos.shape[-1] != D:
                return f"the rotary angles cover {cos.shape[-1]} of the head dim {D} (partial rotary)"
    return rotary, local


def _projection(module: Any, name: str) -> Union[tuple[Tensor, Optional[Tensor]], str]:
    """``(weight, bias)`` of a plain ``nn.Linear``, else why not."""
    if type(module) is not nn.Linear:
        return f"{name} is a {type(module).__name__}, not a plain Linear"
    return module.weight, module.bias


def _attention_weights(attention: nn.Module, H: int, K: int, D: int
                       ) -> Union[tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor]], str]:
    """The packed ``[(H + 2K) * D, E]`` query/key/value weight and bias (a view of Phi-3's,
    a copy of the three others), the output product's weight and bias."""
    parts = {name for name, _ in attention.named_children()} - {"q_norm", "k_norm"}  # read by the caller
    fused = parts == {"qkv_proj", "o_proj"}
    if not fused and parts != {"q_proj", "k_proj", "v_proj", "o_proj"}:
        extra = sorted(parts - {"q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj"})
        return (f"the attention holds {', '.join(extra)}, which the native step does not compute" if extra
                else f"the attention's products are {sorted(parts)}")
    found = {}
    for name in ("qkv_proj", "o_proj") if fused else ("q_proj", "k_proj", "v_proj", "o_proj"):
        found[name] = _projection(getattr(attention, name), f"self_attn.{name}")
        if isinstance(found[name], str):
            return found[name]
    if fused:
        qkv, qkv_bias = found["qkv_proj"]
    else:
        (q, q_bias), (k, k_bias), (v, v_bias) = found["q_proj"], found["k_proj"], found["v_proj"]
        qkv = torch.cat((q, k, v))
        biases = (q_bias, k_bias, v_bias)
        qkv_bias = (None if all(bias is None for bias in biases) else
                    torch.cat([bias if bias is not None else q.new_zeros(w.shape[0])
                               for bias, w in zip(biases, (q, k, v))]))
    if qkv.shape[0] != (H + 2 * K) * D:
        return f"the query/key/value products give {qkv.shape[0]} features, not (H + 2K) * D = {(H + 2 * K) * D}"
    out, out_bias = found["o_proj"]
    return qkv, qkv_bias, out, out_bias


def _mlp_weights(mlp: nn.Module) -> Union[tuple[list[Optional[Tensor]], Any], str]:
    """The kernel's ``[in, in bias, gate, gate bias, down, down bias]`` entries of a gated
    feed-forward net (Phi-3's fused gate/up product split into two views) and its activation."""
    parts = {name for name, module in mlp.named_children()}
    activation = getattr(mlp, "act_fn", getattr(mlp, "activation_fn", None))
    products = parts - {"act_fn", "activation_fn"}
    if products == {"gate_up_proj", "down_proj"}:
        found = _projection(mlp.gate_up_proj, "mlp.gate_up_proj")
        if isinstance(found, str):
            return found
        weight, bias = found
        width = weight.shape[0] // 2
        gate, up = weight[:width], weight[width:]  # chunk(2): the gate first; row slices stay contiguous
        gate_bias, up_bias = (None, None) if bias is None else (bias[:width], bias[width:])
    elif products == {"gate_proj", "up_proj", "down_proj"}:
        (gate, gate_bias), (up, up_bias) = (_projection(mlp.gate_proj, "mlp.gate_proj"),
                                            _projection(mlp.up_proj, "mlp.up_proj"))
    else:
        return f"the feed-forward net holds {sorted(products)}, not a gated net's products"
    down = _projection(mlp.down_proj, "mlp.down_proj")
    if isinstance(down, str):
        return down
    return [up, up_bias, gate, gate_bias, down[0], down[1]], activation


def _causal_lm_parts(model: nn.Module) -> Union[tuple[nn.Module, nn.Module], str]:
    """``(base model, LM head)`` of a transformers ``*ForCausalLM``, else why not."""
    base, head = getattr(model, "model", None), getattr(model, "lm_head", None)
    if not isinstance(base, nn.Module) or not isinstance(getattr(base, "layers", None), nn.ModuleList):
        return f"{type(model).__name__} has no base model with a list of layers"
    if type(head) is not nn.Linear:
        return f"{type(model).__name__} has no plain Linear LM head"
    for name in ("embed_tokens", "norm", "rotary_emb"):
        if not isinstance(getattr(base, name, None), nn.Module):
            return f"the base model has no {name}"
    return base, head


def _layer_norms(layer: nn.Module, names: tuple[Optional[str], ...], eps: float, index: int
                 ) -> Union[list[Optional[Tensor]], str]:
    """The kernel's weights of a layer's four norms (pre-attention, pre-feed-forward,
    post-attention, post-feed-forward; ``None`` where the wiring has none)."""
    found: list[Optional[Tensor]] = []
    for name in names:
        if name is None:
            found.append(None)
            continue
        norm = getattr(layer, name)
        if getattr(norm, "variance_epsilon", getattr(norm, "eps", None)) != eps:
            return f"layer {index}'s {name} differs in epsilon from the final norm"
        weight = _norm_weight(norm, eps)
        if isinstance(weight, str):
            return f"layer {index}'s {name}: {weight}"
        found.append(weight)
    return found


def native_layout(model: nn.Module) -> Union[NativeLayout, str]:
    """The kernel's weights of a transformers causal LM whose layers are what it computes,
    else the first reason they are not.

    Args:
        model: a transformers ``*ForCausalLM`` (or a :class:`~attnlab.hf.TransformersModel`).

    Returns:
        :class:`NativeLayout` (weights are the model's own tensors, but for the packed
        query/key/value weight of families that keep three, and ``1 + w`` norm weights),
        or a one-line reason.
    """
    model = getattr(model, "model", model) if not hasattr(model, "lm_head") else model
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _WIRINGS:
        return f"model_type {model_type!r} is not a family the native step computes ({', '.join(_WIRINGS)})"
    parts = _causal_lm_parts(model)
    if isinstance(parts, str):
        return parts
    base, head = parts
    wiring = _WIRINGS[model_type]
    expected = {"self_attn", "mlp"} | {name for name in wiring if name is not None}
    layers = list(base.layers)
    first = layers[0].self_attn
    H, K = config.num_attention_heads, config.num_key_value_heads
    D = getattr(first, "head_dim", None)
    if not isinstance(D, int) or D % 2:
        return f"head dim {D!r} is not an even int"
    rotaries = _rotaries(config, base.rotary_emb, config.hidden_size, D)
    if isinstance(rotaries, str):
        return rotaries
    eps = getattr(base.norm, "variance_epsilon", getattr(base.norm, "eps", None))
    if not isinstance(eps, float):
        return "the final norm has no epsilon"
    weights: list[Optional[Tensor]] = []
    extras: list[Optional[Tensor]] = []
    scales, windows, activations, softcaps = [], [], set(), set()
    for index, layer in enumerate(layers):
        children = {name for name, _ in layer.named_children()}
        dropouts = {name for name in children - expected if isinstance(getattr(layer, name), nn.Dropout)}
        if children - dropouts != expected:
            return f"layer {index} holds {sorted(children - dropouts)}, not {sorted(expected)}"
        if layer.training and any(getattr(layer, name).p for name in dropouts):
            return f"layer {index} has dropout, in training mode"
        attention = layer.self_attn
        found = _attention_weights(attention, H, K, D)
        if isinstance(found, str):
            return f"layer {index}: {found}"
        qkv, qkv_bias, out, out_bias = found
        mlp = _mlp_weights(layer.mlp)
        if isinstance(mlp, str):
            return f"layer {index}: {mlp}"
        ffn, activation = mlp
        activations.add(_activation_code(activation))
        norms = _layer_norms(layer, wiring, eps, index)
        if isinstance(norms, str):
            return norms
        query_key = _layer_norms(attention, tuple(name if hasattr(attention, name) else None
                                                  for name in ("q_norm", "k_norm")), eps, index)
        if isinstance(query_key, str):
            return query_key
        scale = getattr(attention, "scaling", None)
        if not isinstance(scale, float):
            return f"layer {index}'s attention has no float scaling"
        scales.append(scale)
        windows.append(_window_of(attention, config) or 0)
        softcaps.add(getattr(attention, "attn_logit_softcapping", None) or 0.0)
        weights += [norms[0], None, qkv, qkv_bias, out, out_bias, norms[1], None, *ffn]
        extras += [*query_key, norms[2], norms[3]]
    if None in activations or len(activations) != 1:
        return "the feed-forward activation is none of SiLU, GELU (erf or tanh) and ReLU"
    if len(softcaps) != 1:
        return "the layers differ in attention soft-capping"
    final_norm = _norm_weight(base.norm, eps)
    if isinstance(final_norm, str):
        return f"the final norm: {final_norm}"
    weights += [final_norm, None, head.weight, head.bias]
    for tensor in weights + extras:
        if tensor is not None and not (tensor.dtype == torch.float32 and tensor.device.type == "cpu"
                                       and tensor.is_contiguous()):
            return "the weights are not contiguous float32 CPU tensors"
    rotary, local = rotaries
    return NativeLayout(weights, scales, H, K, D, eps, activations.pop(), base.embed_tokens, rotary,
                        extras if any(extra is not None for extra in extras) else [], windows, local,
                        float(softcaps.pop()), float(getattr(config, "final_logit_softcapping", None) or 0.0))


def _hook_reason(model: nn.Module, embedding: nn.Module) -> Optional[str]:
    """Why the step, which calls no module's forward but the input embedding's, would skip
    something the model's modules would do: hooks, head masks, inspection routes."""
    from torch.nn.modules import module as module_globals

    if module_globals._global_forward_hooks or module_globals._global_forward_pre_hooks:
        return "global forward hooks are set"
    skipped = set(embedding.modules())
    for name, module in model.named_modules():
        if module in skipped:
            continue  # the step calls the embedding as a module: its hooks run
        hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
        if any(getattr(hook, "__module__", None) != _TRANSFORMERS_CAPTURE for hook in hooks):
            return f"{name or 'the model'} has forward hooks"
        if "forward" in vars(module):
            return f"{name or 'the model'} has a forward set on the module itself"
        if head_scale_of(module) is not None or route_of(module) is not None:
            return f"{name} has a head mask or an inspection route"
    return None


def _options_reason(model: nn.Module, options: Mapping[str, Any]) -> Optional[str]:
    unknown = sorted(key for key, value in options.items() if key not in _SERVED_OPTIONS and value is not None)
    if unknown:
        return f"generate option {unknown[0]} runs through transformers' generate"
    generation_config = getattr(model, "generation_config", None)
    do_sample = options.get("do_sample")
    if do_sample if do_sample is not None else getattr(generation_config, "do_sample", False):
        return "sampling runs through transformers' generate (its logits processors)"
    if getattr(generation_config, "repetition_penalty", None) not in (None, 1.0):
        return "the model's generation config sets a repetition penalty"
    return None


def unserved_reason(model: nn.Module, batch: int, **options: Any) -> Optional[str]:
    """``None`` where the native step serves greedy generation of ``batch`` rows with
    transformers decoder ``model``, else why not (as
    :func:`attnlab.models.decoder.native_decoding.unserved_reason` says for attnlab's decoders).

    Args:
        model: a transformers ``*ForCausalLM`` (or a :class:`~attnlab.hf.TransformersModel`).
        batch: ``B``.
        **options: the ``generate`` options of the call (``output_attentions``, ``do_sample``, ...).
    """
    model = getattr(model, "model", model) if not hasattr(model, "lm_head") else model
    if options.pop("output_attentions", False):
        return "the weights are asked for: transformers' path records them through attnlab's attention"
    if not 0 < batch <= MAX_ROWS:
        return f"batch {batch} is past the {MAX_ROWS} rows of the few-row kernel"
    if torch.is_autocast_enabled("cpu"):
        return "autocast is on"
    reason = _options_reason(model, options)
    if reason is not None:
        return reason
    layout = native_layout(model)
    if isinstance(layout, str):
        return layout
    reason = _hook_reason(model, layout.embedding)
    if reason is not None:
        return reason
    return native_unavailable_reason(_KERNEL)


def _first_id(value: Any) -> Optional[int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _stop_ids(model: nn.Module, eos_token_id: Any) -> list[int]:
    value = eos_token_id if eos_token_id is not None else getattr(model.generation_config, "eos_token_id", None)
    values = value if isinstance(value, (list, tuple)) else [value]
    return [int(token) for token in values if token is not None and int(token) >= 0]


class NativeSteps:
    """The prompt pass of a transformers decoder, then each new token as one native call.

    Args:
        model: a transformers ``*ForCausalLM``.
        layout: its :func:`native_layout`.
        input_ids: ``[B, T]`` prompt ids, left-padded.
        mask: ``[B, T]`` long, 1 on real tokens.
        capacity: ``C``, the positions the cache holds (prompt and new tokens).

    Attributes:
        logits: ``[B, V]`` float32 next-token logits of the latest pass.
    """

    def __init__(self, model: nn.Module, layout: NativeLayout, input_ids: Tensor, mask: Tensor,
                 capacity: int) -> None:
        from transformers import DynamicCache

        B, T = input_ids.shape
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # [B, T] as transformers' generate numbers them
        cache = DynamicCache()  # every position kept: the sliding window is the steps' mask
        # transformers names the cache argument `cache` from 5.24 on, `past_key_values` before
        keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                        logits_to_keep=1, **{keyword: cache})
        self.logits = out.logits[:, -1].float()  # [B, V]
        keys, values = [], []
        for layer in cache.layers:
            for stored, into in ((layer.keys, keys), (layer.values, values)):
                store = stored.new_zeros(B, stored.shape[1], capacity, stored.shape[3])  # [B, K, C, D]
                store[:, :, :T] = stored
                into.append(store)
        keep = mask.bool()
        # StepSlots reads a window, a length limit and learned positions (none here) off a model
        view = SimpleNamespace(config=SimpleNamespace(sliding_window=None, max_len=math.inf),  # windows: the kernel's
                               embed_positions=None)
        self.slots = StepSlots(view, B, capacity, T, None if bool(keep.all()) else keep, input_ids.device)
        self.layout = layout
        self.arguments = (layout.weights, keys, values, layout.scales, layout.num_heads, layout.num_kv_heads,
                          0, layout.eps, layout.activation, False)  # 0: RMSNorm; False: no weights kept
        windows = layout.windows if any(layout.windows) else []
        self.options = dict(extras=layout.extras or None, windows=windows,
                            attention_softcap=layout.attention_softcap, logit_softcap=layout.logit_softcap)
        self.kernel = _native.build(_KERNEL)

    @torch.no_grad()
    def __call__(self, tokens: Tensor) -> Tensor:
        """Tokens ``[B]`` -> next-token logits ``[B, V]`` (also kept in :attr:`logits`)."""
        slots, layout = self.slots, self.layout
        slot = slots.next_slot()
        x = layout.embedding(tokens)  # [B, E]
        cos, sin = layout.rotary(x[:, None], slots.positions[:, None])  # ([B, 1, D],) x 2
        local = {}
        if layout.local_rotary is not None:
            cos_local, sin_local = layout.local_rotary(x[:, None], slots.positions[:, None])
            local = dict(cos_local=cos_local[:, 0].contiguous(), sin_local=sin_local[:, 0].contiguous())
        self.logits, _ = self.kernel.step(x.contiguous(), cos[:, 0].contiguous(), sin[:, 0].contiguous(),
                                          slots.allowed, slot, *self.arguments, **self.options, **local)
        slots.step_done()
        return self.logits


@torch.no_grad()
def native_generate(model: nn.Module, input_ids: Tensor, attention_mask: Optional[Tensor] = None, *,
                    max_new_tokens: int = 20, eos_token_id: Any = None, pad_token_id: Optional[int] = None,
                    do_sample: Optional[bool] = None) -> GenerationOutput:
    """Greedy generation by the native step, as transformers' ``generate(do_sample=False)``.

    Args:
        model: a transformers ``*ForCausalLM`` :func:`unserved_reason` found no reason against.
        input_ids: ``[B, T]`` prompt ids, left-padded.
        attention_mask: ``[B, T]``, 1 on real tokens; ``None``: all real.
        max_new_tokens: tokens to add (at least 1).
        eos_token_id: a row stops at this token (or any of a list); default the model's
            generation config's.
        pad_token_id: what stopped rows continue with; default the generation config's, else
            the first eos id.
        do_sample: ``False`` or ``None`` (sampling is transformers').

    Returns:
        :class:`~attnlab.models.decoder.generation.GenerationOutput` without attentions.
    """
    model = getattr(model, "model", model) if not hasattr(model, "lm_head") else model
    layout = native_layout(model)
    if isinstance(layout, str) or do_sample:
        raise ValueError(f"the native step does not serve this call: {layout if isinstance(layout, str) else 'sampling'}")
    B, T = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    stops = _stop_ids(model, eos_token_id)
    pad = pad_token_id if pad_token_id is not None else _first_id(getattr(model.generation_config,
                                                                          "pad_token_id", None))
    pad = pad if pad is not None else (stops[0] if stops else None)
    steps = NativeSteps(model, layout, input_ids, mask, T + max_new_tokens)
    sequences = input_ids
    finished = torch.zeros(B, dtype=torch.bool)
    stop_ids = torch.tensor(stops, dtype=torch.long)
    for step in range(max_new_tokens):
        token = steps.logits.argmax(-1)  # [B]
        if stops:
            token = torch.where(finished, torch.full_like(token, pad), token)
            finished = finished | torch.isin(token, stop_ids)
        sequences = torch.cat((sequences, token[:, None]), dim=1)  # [B, S]
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        steps(token)
    full_mask = torch.cat((mask.bool(), torch.ones(B, sequences.shape[1] - T, dtype=torch.bool)), dim=1)
    return GenerationOutput(sequences=sequences, attention_mask=full_mask, prompt_length=T, attentions=None)
