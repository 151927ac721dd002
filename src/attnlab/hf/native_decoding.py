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
rounding). A model in bfloat16 or float16 keeps its matrices and the cache in that dtype
and the step computes in float32: closer to exact than transformers' own forward in the
dtype, which rounds every operation, so where two tokens nearly tie the two may pick
differently. Asking for the weights keeps transformers' path, where attnlab's attention
function records them.

Dimension letters: ``B`` batch, ``T`` prompt length, ``H`` query heads, ``K`` key/value
heads, ``C`` cache slots, ``D`` head dim, ``E`` model dim, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from types import SimpleNamespace
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .. import _native, _precision
from .._dispatch import native_unavailable_reason
from .._threads import threads_for_load
from ..attention.interface import head_scale_of
from ..inspect.compute.routing import route_of
from ..models.decoder.generation import GenerationOutput
from ..models.decoder.native_decoding import call_reason
from ..models.decoder.step_slots import StepSlots
from ._native_layout import NativeLayout, native_layout

__all__ = ["NativeLayout", "NativeSteps", "native_generate", "native_layout", "unserved_reason"]

_KERNEL = "decode_step"
# transformers installs these hooks once a call asks for attentions or hidden states; they
# record only inside such a call, which never runs the native step
_TRANSFORMERS_CAPTURE = "transformers.utils.output_capturing"
# options of generate the native loop does as transformers' greedy search does
_SERVED_OPTIONS = {"eos_token_id", "pad_token_id", "do_sample"}


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
    unknown = sorted(key for key, value in options.items()
                     if key not in _SERVED_OPTIONS and value is not None)
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
    reason = call_reason(batch) or _options_reason(model, options)
    if reason is not None:
        return reason
    layout = native_layout(model)
    if isinstance(layout, str):
        return layout
    reason = _hook_reason(model, layout.embedding)
    if reason is not None:
        return reason
    return native_unavailable_reason(_KERNEL)


class _Float32Products(TorchFunctionMode):
    """Inside, ``F.linear`` of bfloat16 operands runs as float32 GEMMs on a CPU that would
    emulate bfloat16 (:func:`attnlab._precision.linear`: the numbers of a bfloat16 GEMM with
    float32 sums, about 4x sooner on AVX2), as attnlab's own decoders' prompt pass does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            return _precision.linear(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


def _first_id(value: Any) -> Optional[int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _stop_ids(model: nn.Module, eos_token_id: Any) -> list[int]:
    value = eos_token_id
    if value is None:
        value = getattr(model.generation_config, "eos_token_id", None)
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

        layout.refresh()  # the layout's own copies of the weights, as the weights are now
        B, T = input_ids.shape
        # [B, T], as transformers' generate numbers left-padded rows
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = DynamicCache()  # every position kept: the sliding window is the steps' mask
        # transformers names the cache argument `cache` from 5.24 on, `past_key_values` before
        keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        emulated = _precision.bf16_is_emulated(layout.weights[-2])  # the LM head's weight
        with torch.no_grad(), _Float32Products() if emulated else contextlib.nullcontext():
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
        # (the windows are the kernel's, per layer)
        view = SimpleNamespace(config=SimpleNamespace(sliding_window=None, max_len=math.inf),
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
        x = layout.embedding(tokens).float()  # [B, E]: the model's embedding (and scale), in float32
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
        why = layout if isinstance(layout, str) else "sampling"
        raise ValueError(f"the native step does not serve this call: {why}")
    B, T = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    stops = _stop_ids(model, eos_token_id)
    pad = pad_token_id if pad_token_id is not None else _first_id(getattr(model.generation_config,
                                                                          "pad_token_id", None))
    pad = pad if pad is not None else (stops[0] if stops else None)
    # Every pass runs on the cores other processes leave free (attnlab._threads), as attnlab's
    # own generate does: the step's parallel loops wait at each product for a thread another
    # process holds.
    with threads_for_load():
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
        with threads_for_load():
            steps(token)
    full_mask = torch.cat((mask.bool(), torch.ones(B, sequences.shape[1] - T, dtype=torch.bool)), dim=1)
    return GenerationOutput(sequences=sequences, attention_mask=full_mask, prompt_length=T, attentions=None)
