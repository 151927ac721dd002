"""Exact attention weights at long context: chosen query rows and statistics against sdpa alone.

A random Llama-style model of a 1B model's width (hidden 2048, 32 heads / 8 key-value heads,
MLP 8192) in bfloat16, 4 layers (memory is per layer: more layers add time, not peak). For
each length, in a fresh process each (so that peaks do not mix), one forward:

* ``sdpa``: transformers' own fused attention, no weights (the reference);
* ``rows``: every layer's exact weights of the last 16 query rows over every key
  (``attach(model, layers="all", rows=16)``);
* ``statistics``: every layer's exact weights reduced to the analyzer's statistics block by
  block of query rows (``attach(model, statistics=True)``), never held whole.

It prints the time and the peak resident memory above the loaded model (and the whole
peak) of each, and what one layer's full ``[H, T, T]`` map would take (eager's
``output_attentions``), with the CPU. Timings mean something only on an idle machine.

    python benchmarks/long_context.py                      # 1k, 4k, 16k, 32k tokens
    python benchmarks/long_context.py --sizes 1024 4096 --modes sdpa rows
    python benchmarks/long_context.py --quick              # a small model, short inputs
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

from attnlab._machine import machine_line

MODES = ("sdpa", "rows", "statistics")


def _model(args: argparse.Namespace):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=args.width, intermediate_size=4 * args.width, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=1024,
        max_position_embeddings=max(args.sizes), attn_implementation="sdpa",
    )
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: no float32 copy to count
    try:
        model = transformers.LlamaModel(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    return model


def _peak_bytes() -> int:
    """The peak resident memory since the last :func:`_reset_peak` (Linux's VmHWM), else
    since the process began."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _reset_peak() -> None:
    """Start the peak afresh (Linux: writing 5 to clear_refs resets VmHWM), so that building
    the model does not count."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def child(args: argparse.Namespace) -> None:
    from attnlab.hf import attach

    model = _model(args)
    ids = torch.randint(0, 1024, (1, args.size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids[:, :8])  # first-call set-up outside the measurement
    _reset_peak()
    loaded = _peak_bytes()
    started = time.perf_counter()
    with torch.no_grad():
        if args.mode == "sdpa":
            model(ids)
            kept = 0
        elif args.mode == "rows":
            with attach(model, layers="all", rows=args.rows) as seen:
                model(ids)
            kept = sum(weights.numel() * weights.element_size() for weights in seen.attentions)
            assert all(weights.shape[-2:] == (args.rows, args.size) for weights in seen.attentions)
        else:
            with attach(model, statistics=True) as seen:
                model(ids)
            means = seen.statistics()
            kept = 0
            assert len(means) == args.layers and all(v is not None for v in means["layer_1"]["entropy"])
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "peak": _peak_bytes(), "loaded": loaded, "kept": kept}))


def _run(size: int, mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", "--size", str(size), "--mode", mode,
               "--layers", str(args.layers), "--width", str(args.width), "--heads", str(args.heads),
               "--kv-heads", str(args.kv_heads), "--rows", str(args.rows), "--sizes", *map(str, args.sizes)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--rows", type=int, default=16, help="last query rows kept in the rows mode")
    parser.add_argument("--quick", action="store_true", help="width 256, 8 / 2 heads, 2 layers, 256 tokens")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.quick:
        args.sizes, args.layers, args.width, args.heads, args.kv_heads = [256], 2, 256, 8, 2
    print(machine_line())
    print(f"random Llama {args.layers} x {args.width} ({args.heads} heads / {args.kv_heads} kv), bfloat16; "
          f"rows: the last {args.rows} query rows of every layer; memory: peak resident above the loaded model "
          f"(whole process peak in brackets)")
    print(f"{'tokens':>7} {'one [H,T,T] map':>16}  " + "  ".join(f"{mode:>26}" for mode in args.modes))
    for size in args.sizes:
        cells = []
        for mode in args.modes:
            result = _run(size, mode, args)
            if "error" in result:
                cells.append(f"{'failed: ' + result['error'][:18]:>26}")
                continue
            above = (result["peak"] - result["loaded"]) / 2**30
            cells.append(f"{result['seconds']:8.1f} s {above:6.2f} GiB ({result['peak'] / 2**30:5.2f})")
        full_map = args.heads * size * size * 2 / 2**30  # bfloat16
        print(f"{size:>7} {full_map:>12.2f} GiB  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
