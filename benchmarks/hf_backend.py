"""attnlab as transformers' attention backend: time and memory against transformers' own.

On a Llama-style model of realistic width (random weights; default 8 layers of width
2048, 32 heads, 8 key-value heads, float32), side by side in one process:

* every layer's weights: ``attach(model, layers="all")`` against transformers' eager
  implementation with ``output_attentions=True`` (goal: <= 0.6x);
* one layer's weights: ``attach(model, layers=[k])`` against plain ``sdpa``, no weights
  (goal: <= 1.05x);
* peak memory of the statistics mode (every layer reduced on the fly) against eager's
  with ``output_attentions`` at 1,024 and 4,096 tokens, each in a fresh process (the peak
  resident memory of the forward, counted afresh once the model is built (Linux), above
  what the process held then), next to one layer's ``[B, H, T, T]`` in float32.

Run (one heavy job at a time on a shared machine)::

    python benchmarks/hf_backend.py            # the figures
    python benchmarks/hf_backend.py --quick    # a smoke run on a tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from attnlab._machine import competing_load, machine_line
from attnlab._dispatch import paths_line

GIB = 1024 ** 3


def build(layers: int, width: int, heads: int, kv_heads: int, vocab: int):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=width, intermediate_size=int(width * 2.75), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=8192,
    )
    return transformers.LlamaModel(config).eval()


def timed(function, repeats: int) -> float:
    function()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(args) -> None:
    import attnlab.hf as hf

    model = build(args.layers, args.width, args.heads, args.kv_heads, args.vocab)
    ids = torch.randint(0, args.vocab, (1, args.length))

    def eager_weights():
        model.set_attn_implementation("eager")
        try:
            model(input_ids=ids, output_attentions=True)
        finally:
            model.set_attn_implementation("sdpa")

    def attnlab_weights():
        with hf.attach(model, layers="all"):
            model(input_ids=ids)

    def sdpa():
        model(input_ids=ids)

    def attnlab_one_layer():
        with hf.attach(model, layers=[args.layers // 2]):
            model(input_ids=ids)

    with torch.no_grad():
        runs = {name: [] for name in ("eager", "all", "sdpa", "one")}
        for _ in range(args.rounds):  # alternating rounds: a slow phase of the machine hits both sides
            runs["eager"].append(timed(eager_weights, args.repeats))
            runs["all"].append(timed(attnlab_weights, args.repeats))
            runs["sdpa"].append(timed(sdpa, args.repeats))
            runs["one"].append(timed(attnlab_one_layer, args.repeats))
    median = {name: statistics.median(values) for name, values in runs.items()}
    print(f"T={args.length}, {args.layers} layers of width {args.width}, {args.heads} heads ({args.kv_heads} kv), "
          f"float32, median of {args.rounds} rounds x {args.repeats}:")
    print(f"  every layer's weights: attnlab {median['all'] * 1e3:.0f} ms; eager + output_attentions "
          f"{median['eager'] * 1e3:.0f} ms -> {median['all'] / median['eager']:.2f}x (goal <= 0.6x); per round "
          + ", ".join(f"{a / e:.2f}" for a, e in zip(runs["all"], runs["eager"])))
    # the weights cannot come cheaper than the same forward without them: the layers' products
    # and everything but attention are transformers' own, the same on both sides
    print(f"  floor for any attention backend: sdpa with no weights {median['sdpa'] * 1e3:.0f} ms -> "
          f"{median['sdpa'] / median['eager']:.2f}x eager's; attnlab's every-layer weights take "
          f"{median['all'] / median['sdpa']:.2f}x that floor")
    print(f"  one layer's weights:   attnlab {median['one'] * 1e3:.0f} ms; sdpa, no weights "
          f"{median['sdpa'] * 1e3:.0f} ms -> {median['one'] / median['sdpa']:.2f}x (goal <= 1.05x); per round "
          + ", ".join(f"{o / s:.2f}" for o, s in zip(runs["one"], runs["sdpa"])))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _reset_peak() -> None:
    """Start the peak resident memory (VmHWM) afresh: building the model peaks above what it
    holds, which would otherwise hide the forward's own peak."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def memory_child(args) -> None:
    """In a fresh process: the peak resident memory a forward adds above the built model."""
    import attnlab.hf as hf

    model = build(args.layers, args.width, args.heads, args.kv_heads, args.vocab)
    ids = torch.randint(0, args.vocab, (1, args.length))
    _reset_peak()
    baseline = _status_kib("VmRSS") * 1024
    with torch.no_grad():
        if args.child == "eager":
            model.set_attn_implementation("eager")
            model(input_ids=ids, output_attentions=True)
        elif args.child == "statistics":
            with hf.attach(model, statistics=True) as seen:
                model(input_ids=ids)
            seen.statistics()
        else:
            model(input_ids=ids)
    peak = _status_kib("VmHWM") * 1024
    print(json.dumps({"extra": max(0, peak - baseline)}))


def memory(args) -> None:
    layer_weights = args.heads * args.length * args.length * 4  # one layer's [1, H, T, T] in float32
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    results = {}
    for mode in ("sdpa", "statistics", "eager"):
        needed = args.layers * layer_weights * 1.5 if mode == "eager" else layer_weights
        if needed > 0.6 * available:
            results[mode] = None
            continue
        command = [sys.executable, __file__, "--child", mode, "--length", str(args.length), "--layers",
                   str(args.layers), "--width", str(args.width), "--heads", str(args.heads), "--kv-heads",
                   str(args.kv_heads), "--vocab", str(args.vocab)]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])["extra"]
    shown = {mode: "skipped (would not fit)" if value is None else f"{value / GIB:.2f} GiB"
             for mode, value in results.items()}
    ratio = (f"{results['statistics'] / layer_weights:.2f}x one layer's weights; "
             f"{(results['statistics'] - results['sdpa']) / GIB:.2f} GiB above sdpa's"
             if results["statistics"] is not None and results["sdpa"] is not None else "")
    print(f"T={args.length}: peak extra memory of a forward: sdpa {shown['sdpa']}; statistics mode "
          f"{shown['statistics']} ({ratio}); eager + output_attentions {shown['eager']}; one layer's "
          f"[1, H, T, T] float32 = {layer_weights / GIB:.2f} GiB")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model, to check the script runs")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--length", type=int, default=1024, help="tokens of the timed input")
    parser.add_argument("--memory-lengths", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-speed", action="store_true", help="only the memory figures")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes for the run (competing load; they stop with it)")
    parser.add_argument("--child", choices=["eager", "statistics", "sdpa"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        memory_child(args)
        return 0
    if args.quick:
        args.layers, args.width, args.heads, args.kv_heads, args.vocab = 2, 64, 4, 2, 100
        args.length, args.memory_lengths, args.repeats, args.rounds = 32, [32], 1, 1
    with competing_load(args.load):
        print(machine_line(args.load))
        print(paths_line())
        if not args.no_speed:
            speed(args)
        for length in args.memory_lengths:
            memory(argparse.Namespace(**{**vars(args), "length": length}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
