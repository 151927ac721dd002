"""Reading a transformers causal LM as attnlab's native decoding step computes it.

:func:`native_layout` reads the model by its structure and config: the layer wiring its
``model_type`` names (which norms sit where), then its modules themselves (plain
``Linear`` products, what its norms and activation compute on a probe, its query/key
norms, its rotary angles and windows, its soft-capping), and gives the kernel's weights,
views of the model's own where it can, or the first reason it cannot. Used by
:mod:`attnlab.hf.native_decoding`.

Dimension letters: ``H`` query heads, ``K`` key/value heads, ``D`` head dim, ``E`` model dim.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._sites import window_of

__all__ = ["NativeLayout", "native_layout"]

# The layer wirings the kernel computes, by model_type: every layer is
# x + post_attn(attn(pre_attn(x))), then x + post_ffn(mlp(pre_ffn(x))); the names of those
# four norms in the layer (None: no norm there). The modules themselves are checked by
# structure below.
_PRE_NORM = ("input_layernorm", "post_attention_layernorm", None, None)
_SANDWICH = ("input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm",
             "post_feedforward_layernorm")
_WIRINGS: dict[str, tuple[Optional[str], ...]] = {
    "llama": _PRE_NORM, "mistral": _PRE_NORM, "qwen2": _PRE_NORM, "phi3": _PRE_NORM, "qwen3": _PRE_NORM,
    "olmo2": (None, None, "post_attention_layernorm", "post_feedforward_layernorm"),
    "gemma2": _SANDWICH, "gemma3_text": _SANDWICH,
}
# the kernel's activation codes (decode_step.cpp: Activation), with the function each is
_ACTIVATIONS: dict[int, Callable[[Tensor], Tensor]] = {
    0: F.silu, 1: F.gelu, 2: lambda x: F.gelu(x, approximate="tanh"), 3: F.relu}
# the dtypes the kernel reads weight matrices and the cache in
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# rotary types whose angles depend on the position alone (the model's rotary module computes them)
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")

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
        copies: what fills the weights that are not the model's own tensors (the packed
            query/key/value weights, Gemma's ``1 + w``) from the model's, in place:
            :meth:`refresh` runs them.
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
    copies: list[Callable[[], None]] = field(default_factory=list)

    def refresh(self) -> None:
        """Copy the model's weights into the layout's own again (they may have changed in a
        way no version counter shows, as through ``.data``)."""
        with torch.no_grad():
            for copy in self.copies:
                copy()


def _probe(width: int) -> Tensor:
    return torch.randn(2, width, generator=torch.Generator().manual_seed(0))  # [2, E]


def _norm_weight(norm: nn.Module, eps: float, copies: list[Callable[[], None]]) -> Union[Tensor, str]:
    """The weight ``w`` with which ``norm(x) = x * rsqrt(mean(x^2) + eps) * w`` (``w`` itself,
    or ``1 + w`` for Gemma's offset form, a copy that ``copies`` refills), found by running the
    norm on a probe."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 1 or getattr(norm, "bias", None) is not None:
        return f"{type(norm).__name__} is not an RMSNorm with one weight"
    x = _probe(weight.shape[0])
    with torch.no_grad():
        got = norm(x)
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        for candidate in (weight, None):
            scale = weight.float() if candidate is not None else 1.0 + weight.float()
            if torch.allclose(got.float(), normed * scale, rtol=1e-5, atol=1e-6):
                if candidate is not None:
                    return weight
                offset = weight.float() + 1.0  # in float32, as Gemma's norm adds it
                copies.append(lambda: offset.copy_(weight).add_(1.0))
                return offset
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


def _attention_weights(attention: nn.Module, H: int, K: int, D: int, copies: list[Callable[[], None]]
                       ) -> Union[tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor]], str]:
    """The packed ``[(H + 2K) * D, E]`` query/key/value weight and bias (a view of Phi-3's,
    a copy of the three others, which ``copies`` refills), the output product's weight and bias."""
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
        copies.append(lambda: torch.cat((q, k, v), out=qkv))
        qkv_bias = None
        if any(bias is not None for bias in (q_bias, k_bias, v_bias)):
            biases = [bias if bias is not None else w.new_zeros(w.shape[0])
                      for bias, w in zip((q_bias, k_bias, v_bias), (q, k, v))]
            qkv_bias = torch.cat(biases)
            copies.append(lambda: torch.cat(biases, out=qkv_bias))
    if qkv.shape[0] != (H + 2 * K) * D:
        return (f"the query/key/value products give {qkv.shape[0]} features, not "
                f"(H + 2K) * D = {(H + 2 * K) * D}")
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


def _layer_norms(layer: nn.Module, names: tuple[Optional[str], ...], eps: float, index: int,
                 copies: list[Callable[[], None]]) -> Union[list[Optional[Tensor]], str]:
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
        weight = _norm_weight(norm, eps, copies)
        if isinstance(weight, str):
            return f"layer {index}'s {name}: {weight}"
        found.append(weight)
    return found


# the layout read last of each model, with the state it was read in (_state): reading probes
# every norm and copies the query/key/value weights, tens of milliseconds a call
_READ: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, Union[NativeLayout, str]]]" = weakref.WeakKeyDictionary()


def _state(model: nn.Module) -> tuple:
    """What a layout depends on that can change after it is read: every parameter and buffer
    (which tensor, its storage, its in-place version, dtype, device), every module's class and
    mode, and the config. Values changed where no version counter sees them (``.data``) are
    caught by :meth:`NativeLayout.refresh`, which copies the weights anew at every call."""
    tensors = (*model.parameters(), *model.buffers())
    return (tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device, t.shape) for t in tensors),
            tuple((type(module), module.training) for module in model.modules()),
            model.config.to_json_string(use_diff=False))


def native_layout(model: nn.Module) -> Union[NativeLayout, str]:
    """The kernel's weights of a transformers causal LM whose layers are what it computes,
    else the first reason they are not.

    The layout is read once per model and kept while the model's tensors, modules and config
    stay the same (its own copies are refilled by :meth:`NativeLayout.refresh`).

    Args:
        model: a transformers ``*ForCausalLM`` (or a :class:`~attnlab.hf.TransformersModel`).

    Returns:
        :class:`NativeLayout` (weights are the model's own tensors, but for the packed
        query/key/value weight of families that keep three, and ``1 + w`` norm weights),
        or a one-line reason.
    """
    model = getattr(model, "model", model) if not hasattr(model, "lm_head") else model
    try:
        state = _state(model)
    except (AttributeError, TypeError):  # not a transformers model: read it, keep nothing
        return _read_layout(model)
    kept = _READ.get(model)
    if kept is not None and kept[0] == state:
        return kept[1]
    layout = _read_layout(model)
    _READ[model] = (state, layout)
    return layout


def _read_layout(model: nn.Module) -> Union[NativeLayout, str]:
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
    copies: list[Callable[[], None]] = []
    scales, windows, activations, softcaps = [], [], set(), set()
    for index, layer in enumerate(layers):
        children = {name for name, _ in layer.named_children()}
        dropouts = {name for name in children - expected if isinstance(getattr(layer, name), nn.Dropout)}
        if children - dropouts != expected:
            return f"layer {index} holds {sorted(children - dropouts)}, not {sorted(expected)}"
        if layer.training and any(getattr(layer, name).p for name in dropouts):
            return f"layer {index} has dropout, in training mode"
        attention = layer.self_attn
        found = _attention_weights(attention, H, K, D, copies)
        if isinstance(found, str):
            return f"layer {index}: {found}"
        qkv, qkv_bias, out, out_bias = found
        mlp = _mlp_weights(layer.mlp)
        if isinstance(mlp, str):
            return f"layer {index}: {mlp}"
        ffn, activation = mlp
        activations.add(_activation_code(activation))
        norms = _layer_norms(layer, wiring, eps, index, copies)
        if isinstance(norms, str):
            return norms
        query_key = _layer_norms(attention, tuple(name if hasattr(attention, name) else None
                                                  for name in ("q_norm", "k_norm")), eps, index, copies)
        if isinstance(query_key, str):
            return query_key
        scale = getattr(attention, "scaling", None)
        if not isinstance(scale, float):
            return f"layer {index}'s attention has no float scaling"
        scales.append(scale)
        windows.append(window_of(attention, config) or 0)
        softcaps.add(getattr(attention, "attn_logit_softcapping", None) or 0.0)
        weights += [norms[0], None, qkv, qkv_bias, out, out_bias, norms[1], None, *ffn]
        extras += [*query_key, norms[2], norms[3]]
    if None in activations or len(activations) != 1:
        return "the feed-forward activation is none of SiLU, GELU (erf or tanh) and ReLU"
    if len(softcaps) != 1:
        return "the layers differ in attention soft-capping"
    final_norm = _norm_weight(base.norm, eps, copies)
    if isinstance(final_norm, str):
        return f"the final norm: {final_norm}"
    weights += [final_norm, None, head.weight, head.bias]
    matrices = [tensor for tensor in weights if tensor is not None and tensor.dim() == 2]
    dtypes = {tensor.dtype for tensor in matrices}
    if len(dtypes) != 1 or not dtypes <= set(_DTYPES):
        return (f"the weight matrices are {', '.join(sorted(str(dtype) for dtype in dtypes))}, not all one of "
                "float32, bfloat16 and float16")
    for tensor in weights + extras:
        if tensor is not None and not (tensor.device.type == "cpu" and tensor.is_contiguous()):
            return "the weights are not contiguous CPU tensors"
    # the kernel reads the matrices in their dtype; the vectors (norms' weights, biases) in float32
    for entries in (weights, extras):
        for index, tensor in enumerate(entries):
            if tensor is not None and tensor.dim() == 1 and tensor.dtype != torch.float32:
                widened = entries[index] = tensor.float()
                copies.append(lambda source=tensor, into=widened: into.copy_(source))
    rotary, local = rotaries
    return NativeLayout(weights, scales, H, K, D, eps, activations.pop(), base.embed_tokens, rotary,
                        extras if any(extra is not None for extra in extras) else [], windows, local,
                        float(softcaps.pop()), float(getattr(config, "final_logit_softcapping", None) or 0.0),
                        copies)
