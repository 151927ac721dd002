"""Generation speed: attnlab's decoder against HuggingFace ``generate`` on the same random Llama.

A random Llama-style model of realistic size (12 layers, width 768, 12 query heads sharing
4 key/value heads, SwiGLU 2048, vocabulary 32000) is saved once and opened by both
(``--family gpt2``: GPT-2 small's shape, vocabulary 32000; ``--family qwen3``, ``gemma3``,
``phi3``, ``olmo2``, ``gemma2``, ``mistral``: the same sizes in that family's transformers
config; ``llama-hf`` and ``qwen2-hf``: a Llama or Qwen2 that attnlab runs as a transformers
model rather than converting it). Models of transformers' families are opened as
``attnlab.load`` opens them (a ``TransformersModel``): their ``generate`` runs attnlab's
native decoding step where it serves (each batch's line says whether, or why not). Greedy
decoding, prompt 128 tokens, 128 new tokens (no early stop), at batch 1 and 8; the runs are
interleaved so that machine noise hits both alike. Two comparisons:

* attnlab ``generate``                            vs  HF ``generate`` with ``attn_implementation="sdpa"``
* attnlab ``generate(output_attentions=True)``    vs  HF ``"eager"`` with ``output_attentions=True``
  (both keep every new token's per-layer, per-head weights)

each for attnlab's default steps and for ``compile=True`` (steps compiled by
``torch.compile``; the first call for a batch size and length compiles, and its time is
printed apart; the timed calls come after it). HuggingFace runs its default (uncompiled)
``generate``.

Throughput is new tokens per second over the whole batch; the prompt pass (prefill) is
timed apart, as ``generate`` with one new token, in prompt tokens per second. With capture,
the bytes of the recorded weights and the process's peak resident memory are printed too,
and the floor of a decoding step: the time of one matrix product with every weight matrix
(each step reads all of them once), which bounds the tokens/s any implementation gets in
that dtype.

``--dtype bfloat16`` (or ``float16``) opens both models in that dtype (HF computes in it;
attnlab's native step reads the weights and cache in it and computes in float32) and adds
attnlab's float32 ``generate`` on the same weights, timed in the same rounds, for the
ratio of the two dtypes; the floor is then the pass over the dtype's weights.
The transformers families run the native step in all three dtypes too.

Run (one heavy job at a time on a shared machine; minutes on a few CPU cores)::

    python benchmarks/generate.py
    python benchmarks/generate.py --quick     # tiny sizes: checks that it runs
    python benchmarks/generate.py --dtype bfloat16 --batches 1 --no-compile
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import attnlab
from attnlab._machine import competing_load, machine_line
from attnlab._dispatch import paths_line
from attnlab._native import build as build_native
from attnlab._packed_weights import packed_for_rows
from attnlab._skinny import serves_rows
from attnlab.hf.opening import TransformersModel, _with_fused_attention, open_transformers
from attnlab.models.decoder.generation import packs_weights
from attnlab.models.decoder.native_decoding import unserved_reason

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# transformers families attnlab opens as transformers models (attnlab.load gives a
# TransformersModel), beside its own (llama, gpt2, mistral: converted into attnlab's decoder)
TRANSFORMERS_FAMILIES = {"qwen3": "Qwen3", "gemma3": "Gemma3Text", "phi3": "Phi3", "olmo2": "Olmo2",
                         "gemma2": "Gemma2", "qwen2-hf": "Qwen2", "llama-hf": "Llama"}
FAMILIES = ("llama", "gpt2", "mistral", *TRANSFORMERS_FAMILIES)


def _config(family: str, quick: bool, vocab: int):
    """The random model's config: the default benchmark size (12 x 768, 12 query heads sharing
    4 key/value heads of dim 64, feed-forward 2048) in ``family``'s config class."""
    import transformers

    if family == "gpt2":  # GPT-2 small's shape: 12 x 768, 12 heads, MLP 3072, learned positions
        sizes = (dict(n_embd=64, n_layer=2, n_head=4) if quick else dict(n_embd=768, n_layer=12, n_head=12))
        return transformers.GPT2Config(**sizes, vocab_size=vocab, n_positions=1024, bos_token_id=1,
                                       eos_token_id=2), transformers.GPT2LMHeadModel
    sizes = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16) if quick else
             dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, head_dim=64))
    common = dict(**sizes, vocab_size=vocab, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=4096), transformers.MistralForCausalLM
    name = "Llama" if family == "llama" else TRANSFORMERS_FAMILIES[family]
    config = getattr(transformers, f"{name}Config")(**common)
    return config, transformers.AutoModelForCausalLM


def build_models(directory: Path, quick: bool, family: str = "llama", dtype: torch.dtype = torch.float32):
    import transformers

    vocab = 500 if quick else 32000
    config, model_class = _config(family, quick, vocab)
    torch.manual_seed(0)
    built = (model_class.from_config(config) if model_class is transformers.AutoModelForCausalLM
             else model_class(config))
    built.save_pretrained(directory)
    from_pretrained = transformers.AutoModelForCausalLM.from_pretrained
    hf = {"eager": from_pretrained(directory, attn_implementation="eager", dtype=dtype).eval()}
    # sdpa, or eager for a family transformers serves only eagerly (Gemma 2), as attnlab opens it
    fused = _with_fused_attention(from_pretrained, directory, dtype=dtype).eval()
    if fused.config._attn_implementation != "sdpa":
        print(f"transformers has no sdpa for {family}: the sdpa rows run its eager attention")
        fused = hf["eager"]
    hf["sdpa"] = fused
    # attnlab.load opens the transformers families as transformers models (open_transformers),
    # and llama-hf / qwen2-hf, which it would convert, the same way here
    def opened(in_dtype: torch.dtype):
        if family in TRANSFORMERS_FAMILIES:
            return open_transformers(directory, dtype=str(in_dtype).removeprefix("torch."))
        return attnlab.load(directory, dtype=in_dtype).model

    ours = opened(dtype)
    if dtype != torch.float32:  # the same weights in float32, for the ratio of the two dtypes
        hf["float32"] = opened(torch.float32)
    return hf, ours, vocab


def native_line(model, batch: int) -> str:
    """Whether attnlab's native decoding step serves ``generate`` of ``batch`` rows, or why not."""
    if isinstance(model, TransformersModel):
        reason, instead = model.unserved_reason(batch), "transformers' generate runs"
    else:
        reason, instead = unserved_reason(model, batch), "attnlab's modules run"
    return "native step serves" if reason is None else f"native step does not serve: {reason}; {instead}"


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def weight_pass(model, batch: int, repeats: int, packed: bool) -> tuple[float, int]:
    """One product of ``batch`` rows with every weight matrix but the input embedding: what one
    decoding step cannot go below (each step reads every weight once). Where the native
    few-row kernel serves ``batch`` rows, the pass calls it directly, on float32 rows as the
    native step does (through the layers, each call's Python would count as reading);
    elsewhere through the model's own layers (``packed``: inside ``packed_for_rows``, as
    ``generate`` runs its steps past the native kernel's rows). Returns the seconds (best of
    ``repeats``) and the bytes of those weights."""
    layers = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    dtype = layers[0].weight.dtype
    widths = {layer.in_features for layer in layers}
    native = serves_rows(batch)
    inputs = {width: torch.randn(batch, width, dtype=torch.float32 if native else dtype) for width in widths}
    kernel = build_native("skinny_linear") if native else None

    def one_pass() -> None:
        for layer in layers:
            if kernel is not None:
                kernel.linear(inputs[layer.in_features], layer.weight, None)
            else:
                layer(inputs[layer.in_features])

    with torch.no_grad(), packed_for_rows(model, batch) if packed else contextlib.nullcontext():
        one_pass()
        seconds = min(timed(one_pass) for _ in range(max(repeats, 3)))
    return seconds, sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)


def recorded_bytes(output) -> int:
    return sum(layer.numel() * layer.element_size() for step in output.attentions for layer in step)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths")
    parser.add_argument("--family", choices=FAMILIES, default="llama",
                        help="the random model's family (default: a Llama of 12 x 768); the transformers "
                             "families (and llama-hf, qwen2-hf) run as transformers models under attnlab")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                        help="both models' dtype (default float32)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=128, help="prompt length")
    parser.add_argument("--new", type=int, default=128, help="new tokens")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the compile=True rows (each compiles for minutes)")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes for the run (competing load; they stop with it)")
    args = parser.parse_args(argv)
    with competing_load(args.load):
        return run(args)


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt, new = (8, 8) if args.quick else (args.prompt, args.new)
    repeats = 1 if args.quick else args.repeats
    dtype = DTYPES[args.dtype]
    with tempfile.TemporaryDirectory() as directory:
        hf, ours, vocab = build_models(Path(directory), args.quick, args.family, dtype)
    ours32 = hf.pop("float32", None)
    print(f"random {args.family} in {args.dtype}; prompt {prompt}, {new} new tokens, greedy; "
          f"best of {repeats}")
    print(machine_line(args.load) + f"; torch's vector width {torch.backends.cpu.get_cpu_capability()}")
    print(paths_line())
    print("| batch | attnlab | tok/s | HF | tok/s | ratio |")
    print("|---|---|---|---|---|---|")
    for batch in args.batches:
        ids = torch.randint(3, vocab, (batch, prompt))
        hf_options = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        own = not isinstance(ours, TransformersModel)
        ours_options = dict(max_new_tokens=new, eos_token_id=-1)
        plain = {} if own else {"output_attentions": False}  # a transformers model records unless told not to
        prefill_options = dict(max_new_tokens=1, eos_token_id=-1, **plain)
        print(f"  batch {batch}: {native_line(ours, batch)}")
        cases: dict[str, Callable[[], object]] = {
            "prefill": lambda: ours.generate(ids, **prefill_options),
            "prefill sdpa": lambda: hf["sdpa"].generate(ids, **{**hf_options, "max_new_tokens": 1,
                                                                "min_new_tokens": 1}),
            "generate": lambda: ours.generate(ids, **plain, **ours_options),
            "compile=True": lambda: ours.generate(ids, compile=True, **ours_options),
            "sdpa": lambda: hf["sdpa"].generate(ids, **hf_options),
            "+weights": lambda: ours.generate(ids, output_attentions=True, **ours_options),
            "+weights compile=True": lambda: ours.generate(ids, output_attentions=True, compile=True,
                                                           **ours_options),
            "eager+attentions": lambda: hf["eager"].generate(ids, output_attentions=True,
                                                             return_dict_in_generate=True, **hf_options),
        }
        if ours32 is not None:
            cases["generate float32"] = lambda: ours32.generate(ids, **plain, **ours_options)
            cases["prefill float32"] = lambda: ours32.generate(ids, **prefill_options)
        compiled = [key for key in cases if "compile" in key]
        if not args.compile or not own:
            for key in compiled:
                del cases[key]
        with torch.no_grad():
            # warm-up: first calls pay set-up
            ours.generate(ids[:, :8], max_new_tokens=2, eos_token_id=-1, **plain)
            hf["sdpa"].generate(ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)
            # compile=True pays its compilation on the first call for a batch size and length
            compile_seconds = {key: timed(cases[key]) for key in compiled if key in cases}
            runs: dict[str, list[float]] = {key: [] for key in cases}
            for _ in range(repeats):
                for key, case in cases.items():
                    runs[key].append(timed(case))
        rate = {key: batch * (prompt if key.startswith("prefill") else new) / min(values)
                for key, values in runs.items()}
        for ours_key, hf_key, hf_label in (("prefill", "prefill sdpa", "prefill, sdpa"),
                                           ("generate", "sdpa", "generate, sdpa"),
                                           ("generate", "generate float32", "attnlab generate, float32"),
                                           ("compile=True", "sdpa", "generate, sdpa"),
                                           ("+weights", "eager+attentions", "eager + output_attentions"),
                                           ("+weights compile=True", "eager+attentions",
                                            "eager + output_attentions")):
            if ours_key not in rate or hf_key not in rate:
                continue
            print(f"| {batch} | {ours_key} | {rate[ours_key]:.1f} | {hf_label} | {rate[hf_key]:.1f} | "
                  f"{rate[ours_key] / rate[hf_key]:.2f}x |")
        # the decoding steps alone: a whole generate less its prompt pass (the best of each)
        pairs = (("attnlab", "generate", "prefill"), ("HF sdpa", "sdpa", "prefill sdpa"),
                 ("attnlab float32", "generate float32", "prefill float32"))
        step_rates = {label: batch * (new - 1) / (min(runs[whole]) - min(runs[prefill]))
                      for label, whole, prefill in pairs
                      if whole in runs and prefill in runs and min(runs[whole]) > min(runs[prefill])}
        print(f"  batch {batch}: decoding steps alone (generate less its prompt pass), tok/s: "
              + ", ".join(f"{label} {value:.1f}" for label, value in step_rates.items()))
        if compile_seconds:
            print(f"  batch {batch}: first compile=True calls (compiling included): "
                  + ", ".join(f"{key} {seconds:.1f} s" for key, seconds in compile_seconds.items()))
        packed = packs_weights(batch, new, compile=False)
        floor, size = weight_pass(ours if own else ours.model, batch, repeats, packed and own)
        how = ("the native few-row kernel" if serves_rows(batch) else
               "MKL packed, as generate runs here" if packed and own else "plain products")
        print(f"  batch {batch}: one pass over the {size / 2**20:.0f} MiB of {args.dtype} weights ({how}; a "
              f"decoding step's floor, up to noise) takes {floor * 1e3:.1f} ms "
              f"({size / floor / 1e9:.1f} GB/s): "
              f"{batch / floor:.1f} tok/s if a step did nothing else")
        captured = ours.generate(ids, max_new_tokens=new, eos_token_id=-1, output_attentions=True)
        print(f"  batch {batch}: recorded weights {recorded_bytes(captured) / 2**20:.2f} MiB; process peak "
              f"resident memory so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
