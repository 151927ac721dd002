"""Generation speed: attnlab's decoder against HuggingFace ``generate`` on the same random Llama.

A random Llama-style model of realistic size (12 layers, width 768, 12 query heads sharing
4 key/value heads, SwiGLU 2048, vocabulary 32000) is saved once and opened by both. Greedy
decoding, prompt 128 tokens, 128 new tokens (no early stop), at batch 1 and 8; the runs are
interleaved so that machine noise hits both alike. Two comparisons:

* attnlab ``generate``                            vs  HF ``generate`` with ``attn_implementation="sdpa"``
* attnlab ``generate(output_attentions=True)``    vs  HF ``"eager"`` with ``output_attentions=True``
  (both keep every new token's per-layer, per-head weights)

Throughput is new tokens per second over the whole batch. With capture, the bytes of the
recorded weights and the process's peak resident memory are printed too, and the floor of
a decoding step: the time of one matrix product with every weight matrix (each step reads
all of them once), which bounds the tokens/s any implementation gets in float32.

Run (one heavy job at a time on a shared machine; minutes on a few CPU cores)::

    python benchmarks/generate.py
    python benchmarks/generate.py --quick     # tiny sizes: checks that it runs
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

import attnlab


def build_models(directory: Path, quick: bool):
    import transformers

    sizes = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=500) if quick else
             dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000))
    config = transformers.LlamaConfig(**sizes, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    hf = {name: transformers.LlamaForCausalLM.from_pretrained(directory, attn_implementation=name).eval()
          for name in ("sdpa", "eager")}
    ours = attnlab.load(directory).model
    return hf, ours, sizes["vocab_size"]


def timed(function: Callable[[], object]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def weight_pass(model, batch: int, repeats: int) -> tuple[float, int]:
    """One matrix product of ``batch`` rows with every weight matrix but the input
    embedding: what one decoding step cannot go below (each step reads every weight once).
    Returns the seconds (best of ``repeats``) and the bytes of those weights."""
    weights = [p for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name]
    inputs = {width: torch.randn(batch, width) for width in {w.shape[1] for w in weights}}

    def one_pass() -> None:
        for weight in weights:
            torch.nn.functional.linear(inputs[weight.shape[1]], weight)

    with torch.no_grad():
        one_pass()
        seconds = min(timed(one_pass) for _ in range(max(repeats, 3)))
    return seconds, sum(weight.numel() * weight.element_size() for weight in weights)


def recorded_bytes(output) -> int:
    return sum(layer.numel() * layer.element_size() for step in output.attentions for layer in step)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model and lengths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=128, help="prompt length")
    parser.add_argument("--new", type=int, default=128, help="new tokens")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt, new = (8, 8) if args.quick else (args.prompt, args.new)
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as directory:
        hf, ours, vocab = build_models(Path(directory), args.quick)
    print(f"prompt {prompt}, {new} new tokens, greedy; best of {repeats}; {torch.get_num_threads()} threads")
    print("| batch | attnlab tok/s | HF sdpa tok/s | ratio | attnlab+weights tok/s | HF eager+attn tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        ids = torch.randint(3, vocab, (batch, prompt))
        hf_options = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        runs: dict[str, list[float]] = {key: [] for key in ("ours", "sdpa", "ours_w", "eager_w")}
        with torch.no_grad():
            ours.generate(ids[:, :8], max_new_tokens=2, eos_token_id=-1)  # warm-up: first calls pay set-up
            hf["sdpa"].generate(ids[:, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)
            for _ in range(repeats):
                runs["ours"].append(timed(lambda: ours.generate(ids, max_new_tokens=new, eos_token_id=-1)))
                runs["sdpa"].append(timed(lambda: hf["sdpa"].generate(ids, **hf_options)))
                runs["ours_w"].append(timed(lambda: ours.generate(ids, max_new_tokens=new, eos_token_id=-1,
                                                                   output_attentions=True)))
                runs["eager_w"].append(timed(lambda: hf["eager"].generate(
                    ids, output_attentions=True, return_dict_in_generate=True, **hf_options)))
        rate = {key: batch * new / min(values) for key, values in runs.items()}
        print(f"| {batch} | {rate['ours']:.1f} | {rate['sdpa']:.1f} | {rate['ours'] / rate['sdpa']:.2f}x | "
              f"{rate['ours_w']:.1f} | {rate['eager_w']:.1f} | {rate['ours_w'] / rate['eager_w']:.2f}x |")
        floor, size = weight_pass(ours, batch, repeats)
        print(f"  batch {batch}: one pass over the {size / 2**20:.0f} MiB "
              f"of weights (a decoding step's floor) takes {floor * 1e3:.1f} ms: at most {batch / floor:.1f} tok/s")
        captured = ours.generate(ids, max_new_tokens=new, eos_token_id=-1, output_attentions=True)
        print(f"  batch {batch}: recorded weights {recorded_bytes(captured) / 2**20:.2f} MiB; process peak "
              f"resident memory so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
