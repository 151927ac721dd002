"""Text generation with a KV cache: greedy or sampled, and the attention of every new token.

Dimension letters: ``B`` batch, ``T`` prompt length, ``N`` final length, ``S`` positions
so far, ``H`` heads, ``V`` vocabulary.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from ..._packed_weights import packed_for_rows
from ..._skinny import serves_rows
from ..._threads import threads_for_load
from ...attention.masks import keep_mask
from ...outputs import LayerAttentions, ModelOutput
from .compiled_decoding import CompiledDecoding, check_no_hooks, compiled_capacity
from .native_decoding import NativeDecoding, unserved_reason

__all__ = ["GenerationOutput", "generate", "next_token_scores", "packs_weights"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class GenerationOutput(ModelOutput):
    """What :func:`generate` returns.

    Attributes:
        sequences: ``[B, N]`` prompt and generated ids (rows that met ``eos_token_id``
            continue with ``pad_token_id``, as HuggingFace's).
        attention_mask: ``[B, N]`` bool, ``True`` on real tokens (left padding of the prompt).
        prompt_length: ``T``, where generated tokens start.
        attentions: with ``output_attentions=True``, one
            :class:`~attnlab.outputs.LayerAttentions` per forward pass of the generation,
            recorded from the cached forward itself: first the prompt's ``[B, H, T, T]``,
            then for each generated token its own ``[B, H, 1, S]`` row over every
            position up to and including itself.
    """

    sequences: Optional[Tensor] = None
    attention_mask: Optional[Tensor] = None
    prompt_length: Optional[int] = None
    attentions: Optional[tuple[LayerAttentions, ...]] = None

    def _require_attentions(self) -> tuple[LayerAttentions, ...]:
        if not self.attentions:
            raise ValueError("no attention was recorded: call generate(..., output_attentions=True)")
        return self.attentions

    def generated_attention(self, index: int) -> LayerAttentions:
        """Generated token ``index``'s (0-based) weights over every position up to itself:
        ``[B, H, S]`` per layer."""
        steps = self._require_attentions()[1:]
        if not -len(steps) <= index < len(steps):
            raise ValueError(f"index must be in [0, {len(steps)}) (generated tokens with attention), got {index}")
        return LayerAttentions([layer[:, :, 0] for layer in steps[index]])

    def attention_maps(self) -> LayerAttentions:
        """The whole causal map of the final sequence, ``[B, H, N, N]`` per layer, assembled
        from the recorded rows (zeros above the diagonal); equal to one full forward pass
        over ``sequences`` with ``output_attentions=True``."""
        prompt, *steps = self._require_attentions()
        T = prompt[0].shape[-1]
        N = T + len(steps)
        maps = []
        for layer, prompt_weights in enumerate(prompt):
            B, H = prompt_weights.shape[:2]
            full = prompt_weights.new_zeros(B, H, N, N)  # [B, H, N, N]
            full[:, :, :T, :T] = prompt_weights
            for step, weights in enumerate(steps):
                full[:, :, T + step, : T + step + 1] = weights[layer][:, :, 0]
            maps.append(full)
        return LayerAttentions(maps)


def next_token_scores(
    logits: Tensor, *, temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None
) -> Tensor:
    """``[B, V]`` logits -> ``[B, V]`` scores to sample from: divided by ``temperature``, all
    but the ``top_k`` best and outside the smallest set whose probability reaches ``top_p``
    set to ``-inf`` (HuggingFace's order of the three)."""
    scores = logits / temperature
    if top_k is not None and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=True)  # [B, V]
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) >= top_p  # mass before this token already reaches top_p
        drop[..., 0] = False  # always keep the best token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores


def _check_options(max_new_tokens, temperature, top_k, top_p) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be > 0 (use do_sample=False for greedy decoding), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def packs_weights(rows: int, new_tokens: int, compile: bool) -> bool:
    """Whether :func:`generate` runs its decoding steps through MKL's packed products by
    default, for ``rows`` sequences and ``new_tokens`` new tokens.

    Decoding steps multiply every weight by ``rows`` rows: from 4 rows on, MKL's packed
    product is much faster than the plain one (see :mod:`attnlab._packed_weights`), but up
    to :data:`attnlab._skinny.MAX_ROWS` rows attnlab's native few-row kernel is faster still
    and needs no copies (batch 4 and 8 whole generate calls: 1.05-1.34x, AVX-512 and AVX2
    builds on an Intel Xeon). The compiled step multiplies by the weights as they are
    (torch.compile cannot take the packed copies). Repacking costs about what a few steps
    save: not worth it for a handful of tokens.
    """
    return rows >= 4 and new_tokens >= 16 and not compile and not serves_rows(rows)


@torch.no_grad()
def generate(
    model,
    input_ids: Tensor,
    attention_mask: Optional[Tensor] = None,
    *,
    max_new_tokens: int = 20,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    eos_token_id: Optional[int] = None,
    pad_token_id: Optional[int] = None,
    seed: Optional[int] = None,
    output_attentions: bool = False,
    pack_weights: Optional[bool] = None,
    compile: bool = False,
) -> GenerationOutput:
    """Continue each prompt by ``max_new_tokens`` tokens, one cached forward per token.

    Greedy decoding (``do_sample=False``) picks the most likely token and gives what
    HuggingFace's ``generate(do_sample=False)`` gives. Sampling draws from the scores of
    :func:`next_token_scores` with a generator seeded by ``seed``: the same seed gives the
    same text.

    After the prompt pass, each decoding step of a float32, bfloat16 or float16 CPU model
    (up to 8 sequences, no forward hooks) is one call into attnlab's native decoding step
    (:mod:`attnlab.models.decoder.native_decoding`); other models run their modules'
    ``forward`` step by step. Both give the same tokens (to float32 rounding; in bfloat16
    and float16 the native step computes in float32 and the modules in the model's dtype,
    so tokens may differ where two logits are within the dtype's rounding).

    Args:
        model: a :class:`~attnlab.models.decoder.DecoderForCausalLM`.
        input_ids: ``[B, T]`` prompt ids, left-padded when prompts differ in length.
        attention_mask: ``[B, T]`` keep mask (1 on real tokens, any dtype); ``None`` = no padding.
        max_new_tokens: tokens to add.
        do_sample: sample instead of taking the most likely token.
        temperature, top_k, top_p: shape the sampling distribution.
        eos_token_id: a row stops at this token (default: the model's ``eos_id``; pass
            ``-1`` to never stop). Generation ends when every row has stopped.
        pad_token_id: what stopped rows continue with (default: the model's ``pad_id``,
            else ``eos_token_id``).
        seed: seed of the sampling generator.
        output_attentions: record every new token's per-layer, per-head weights from the
            cached forward itself (see :class:`GenerationOutput`); the reference kernel
            then runs instead of the fused one.
        pack_weights: multiply the weights by the decoding steps' ``B`` rows through MKL's
            packed product (:func:`attnlab._packed_weights.packed_for_rows`; copies of 2-3x
            the float32 weights' bytes, up to 2 GiB, for the length of the call).
            Default: from batch 4 and 16 new tokens on, where it is faster, unless
            ``compile`` or attnlab's native few-row kernel serves the batch (up to 8 rows,
            faster still); ``False`` saves the memory. The native decoding step takes the
            weights as they are: where it serves, nothing is packed.
        compile: run the decoding steps as one graph compiled by ``torch.compile``
            (:mod:`attnlab.models.decoder.compiled_decoding`) instead: for the models the
            native step does not serve (where it does, it is faster). Steps take about the
            time of their matrix products, after a compilation of seconds to a minute on the first
            call for each batch size, length (in steps of 256) and ``output_attentions``
            (torch keeps them on disk for later processes; past 8 of them in one process it
            runs the step uncompiled, slower). Needs the C++ compiler ``torch.compile`` uses
            on CPUs. The steps do not go through the modules' ``forward``: a model with
            forward hooks (``mask_heads``, ``capture_attention``, your own) is refused.

    Returns:
        :class:`GenerationOutput`.
    """
    _check_options(max_new_tokens, temperature, top_k, top_p)
    if compile:
        check_no_hooks(model)
    if compile and pack_weights:
        raise ValueError("pack_weights=True and compile=True do not combine: the compiled step uses the "
                         "weights as they are; drop one of the two")
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a [B, T] tensor, got {getattr(input_ids, 'shape', type(input_ids))}")
    config = model.config
    B, T = input_ids.shape
    if T == 0:
        raise ValueError("input_ids is empty ([B, 0]): generation continues a prompt of at least one token")
    if T >= config.max_len and max_new_tokens > 0:
        raise ValueError(f"the prompt's {T} tokens fill the model's context of {config.max_len} positions "
                         f"(config.max_len): no room for a new token; shorten the prompt to at most "
                         f"{config.max_len - 1} tokens")
    if T + max_new_tokens > config.max_len:
        raise ValueError(
            f"the prompt's {T} tokens + max_new_tokens={max_new_tokens} exceed the model's context of "
            f"{config.max_len} positions (config.max_len); ask for at most {max(config.max_len - T, 0)} new tokens"
        )
    eos = config.eos_id if eos_token_id is None else (None if eos_token_id < 0 else eos_token_id)
    if eos is not None and eos >= config.vocab_size:
        if eos_token_id is not None:
            raise ValueError(f"eos_token_id={eos_token_id} lies outside the vocabulary of {config.vocab_size} tokens; "
                             f"pass a token id below {config.vocab_size}, or -1 to never stop")
        logger.warning("the model's eos_id=%d lies outside its vocabulary of %d tokens (a config default?): no "
                       "token can end a row, so every row runs max_new_tokens; pass eos_token_id to stop on one",
                       eos, config.vocab_size)
        eos = None
    pad = pad_token_id if pad_token_id is not None else (config.pad_id if config.pad_id is not None else eos)
    if eos is not None and pad is not None and not 0 <= pad < config.vocab_size:
        raise ValueError(f"{'pad_token_id' if pad_token_id is not None else 'the model config pad_id'}={pad} lies "
                         f"outside the vocabulary of {config.vocab_size} tokens, and rows that end at eos "
                         f"({eos}) continue with it; pass pad_token_id below {config.vocab_size}")
    device = input_ids.device
    keep = None
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (B, T):
            raise ValueError(f"attention_mask must be [B, T] = [{B}, {T}], got {tuple(attention_mask.shape)}")
        keep = keep_mask(attention_mask.to(device), name="attention_mask")
        if not bool(keep[:, -1].all()):
            raise ValueError(
                "attention_mask has padding at the end of a prompt: generation continues each row's last "
                "token, so pad on the left (the tokenizer of attnlab.load pads decoders on the left)"
            )
        keep = None if bool(keep.all()) else keep
    generator = None
    if do_sample and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    capacity = T + max_new_tokens + 1
    cache = model.new_cache(capacity=compiled_capacity(capacity) if compile else capacity)
    recorded: list = []
    # Every forward runs on the cores other processes leave free (attnlab._threads).
    with threads_for_load():
        out = model(input_ids, keep, past_key_values=cache, use_cache=True, output_attentions=output_attentions,
                    logits_to_keep=1)
    logits, attentions = out.logits, out.attentions  # [B, 1, V], per layer [B, H, T, T]
    if output_attentions:
        recorded.append(attentions)
    steps = None  # None: the modules' forward
    if compile:
        steps = CompiledDecoding(model, cache, keep, output_attentions)
    elif max_new_tokens > 1 and unserved_reason(model, B) is None:
        steps = NativeDecoding(model, cache, keep, output_attentions)
    sequences = input_ids
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    packing = pack_weights if pack_weights is not None else packs_weights(B, max_new_tokens, compile)
    packing = packing and steps is None and max_new_tokens > 1  # the native steps take the weights as they are
    with packed_for_rows(model, B) if packing else contextlib.nullcontext():
        for step in range(max_new_tokens):
            logits = logits[:, -1].float()  # [B, V]
            if do_sample:
                scores = next_token_scores(logits, temperature=temperature, top_k=top_k, top_p=top_p)
                token = torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]  # [B]
            else:
                token = logits.argmax(-1)  # [B]
            if eos is not None:
                token = torch.where(finished, torch.full_like(token, pad if pad is not None else eos), token)
                finished = finished | (token == eos)
            sequences = torch.cat((sequences, token[:, None]), dim=1)  # [B, S]
            if keep is not None:
                keep = torch.cat((keep, keep.new_ones(B, 1)), dim=1)  # [B, S]
            last = step == max_new_tokens - 1 or bool(finished.all())
            if last and not output_attentions:
                break
            # With capture on, the last token also goes through the model, to record its own row.
            with threads_for_load():
                if steps is not None:
                    logits, attentions = steps(token)  # [B, 1, V], per layer [B, H, 1, S]
                else:
                    out = model(token[:, None], keep, past_key_values=cache, use_cache=True,
                                output_attentions=output_attentions)
                    logits, attentions = out.logits, out.attentions
            if output_attentions:
                recorded.append(attentions)
            if last:
                break
    full_keep = keep if keep is not None else torch.ones_like(sequences, dtype=torch.bool)
    return GenerationOutput(sequences=sequences, attention_mask=full_keep, prompt_length=T,
                            attentions=tuple(recorded) if output_attentions else None)
