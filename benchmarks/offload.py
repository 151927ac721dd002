"""Peak memory of a model larger than its budget: ``attnlab.load`` whole, then within a CPU budget with
the rest offloaded to disk, each followed by a statistics pass.

A random float32 Llama-style checkpoint is written into a temporary folder by transformers'
``save_pretrained`` (hidden 1024, 8 layers, 16 heads, feed-forward 2816, vocabulary 8000, untied
LM head: 119.2M parameters, 455 MiB). Each configuration then runs in a fresh process, so
that the high-water mark of its resident memory (``resource.getrusage(...).ru_maxrss``) is its
own: ``attnlab.load`` (whole, as attnlab's own decoder; whole through transformers with
``device_map="auto"`` and no budget; ``device_map="auto"`` with ``max_memory={"cpu": budget}``
and an ``offload_dir``), then attnlab's statistics of every layer and head on a few random token
sequences (``model.statistics()``, the pass ``attnlab analyze`` runs). Printed per configuration:
where the modules went, the peak resident memory above what the process held before loading
(after loading, and after the statistics), against the budget and the weights' size, the load
and statistics times, and the largest difference of any statistic from the whole model's.

    python benchmarks/offload.py                      # whole, and budgets of 1/2 and 1/4 of the weights
    python benchmarks/offload.py --budgets 0.3        # one budget, as a fraction of the weights
    python benchmarks/offload.py --quick              # a tiny model, for a smoke test

The folder is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from _child import run_child

MiB = 2 ** 20
# A child's ru_maxrss starts from its parent's resident size at the fork, so the parent stays
# small: torch is imported only in the children, and a child of its own writes the checkpoint.
WRITE = r"""
import sys, torch, transformers
hidden, layers, heads, intermediate, vocab = (int(value) for value in sys.argv[2:7])
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                                  max_position_embeddings=2048, tie_word_embeddings=False,
                                  architectures=["LlamaForCausalLM"])
model = transformers.LlamaForCausalLM(config)
model.save_pretrained(sys.argv[1])
print(sum(parameter.numel() for parameter in model.parameters()))
"""
MEASURE = r"""
import json, resource, sys, time
import torch
import accelerate, transformers  # imported before the baseline, for every configuration alike
import attnlab
from attnlab._machine import machine_line
from attnlab.hf.placement import describe_map
from attnlab.inspect.compute.inspectable import inspectable

directory, offload = sys.argv[1], sys.argv[3]
budget, texts, length = (int(value) for value in (sys.argv[2], sys.argv[4], sys.argv[5]))
vocab = json.load(open(f"{directory}/config.json"))["vocab_size"]
ids = torch.randint(1, vocab, (texts, length), generator=torch.Generator().manual_seed(0))
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = peak()
start = time.perf_counter()
placement = {} if budget == 0 else {"device_map": "auto"}  # budget -1: the map, no budget
placement.update({} if budget <= 0 else {"max_memory": {"cpu": budget}, "offload_dir": offload})
model = inspectable(attnlab.load(directory, tokenizer=False, **placement).model)
loaded, load_seconds = peak(), time.perf_counter() - start
start = time.perf_counter()
with torch.no_grad(), model.statistics() as statistics:
    for batch in ids.split(2):
        model(batch)
means = statistics.means()
inner = getattr(model, "model", model)  # a TransformersModel's transformers model, or attnlab's own
print(json.dumps({"before": before, "loaded": loaded, "peak": peak(), "load_seconds": load_seconds,
                  "statistics_seconds": time.perf_counter() - start, "means": means,
                  "map": describe_map(inner) if getattr(inner, "hf_device_map", None) else "all on the CPU",
                  "kind": type(inner).__name__, "machine": machine_line(), "torch": torch.__version__}))
"""


def measure(directory: Path, budget: int, offload: Path, texts: int, length: int) -> dict:
    """One configuration in a fresh interpreter; its measurements. ``budget`` 0: the model whole, as
    ``attnlab.load`` opens it; -1: ``device_map="auto"`` with no budget (through transformers, on the CPU)."""
    arguments = ["-c", MEASURE, str(directory), str(budget), str(offload), str(texts), str(length)]
    return json.loads(run_child(arguments, f"the run with a budget of {budget} bytes"))


def _size(count: float) -> str:
    return f"{count / MiB:.0f} MiB" if count >= 10 * MiB else f"{count / 1024:.0f} KiB"


def largest_difference(first: dict, second: dict) -> float:
    """The largest absolute difference between two ``{layer: {statistic: [per head]}}``."""
    worst = 0.0
    for layer, statistics in first.items():
        for name, values in statistics.items():
            for a, b in zip(values, second[layer][name]):
                if a is not None and b is not None and a == a and b == b:  # None and nan: no rows
                    worst = max(worst, abs(a - b))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.25],
                        help="CPU budgets as fractions of the weights' size (default: 0.5 and 0.25)")
    parser.add_argument("--texts", type=int, default=8, help="random token sequences in the statistics pass")
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model, two short texts, no row through transformers whole (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.heads, args.intermediate, args.vocab = 64, 4, 4, 128, 100
        args.texts, args.length = 2, 8
    if not all(0 < budget < 1 for budget in args.budgets):
        parser.error(f"--budgets are fractions of the weights between 0 and 1, got {args.budgets}")
    root = Path(tempfile.mkdtemp(prefix="attnlab-offload-"))
    try:
        directory = root / "model"
        sizes = [str(value) for value in (args.hidden, args.layers, args.heads, args.intermediate, args.vocab)]
        count = int(run_child(["-c", WRITE, str(directory), *sizes], "writing the checkpoint"))
        weights = sum(path.stat().st_size for path in directory.glob("*.safetensors"))
        print(f"checkpoint: Llama-style, hidden {args.hidden}, {args.layers} layers, {count / 1e6:.1f}M parameters, "
              f"float32, {_size(weights)}; statistics of {args.texts} random sequences of {args.length} "
              f"tokens, 2 a batch")
        whole = measure(directory, 0, root / "unused", args.texts, args.length)
        print(f"{whole['machine']}; torch {whole['torch']}")
        print(f"before loading (Python, torch, transformers, accelerate and attnlab imported): "
              f"{_size(whole['before'])} resident")
        print("| configuration | CPU budget | weights | modules | peak RSS - before: loading | with statistics "
              "| load time | statistics time | largest statistic difference from whole |")
        print("|---|---|---|---|---|---|---|---|---|")
        rows = [(f"whole ({whole['kind']}, attnlab's own)", 0, whole)]
        if not args.quick:  # a fresh interpreter costs seconds; the smoke test skips this row
            rows.append(("whole through transformers (device_map auto, no budget)", -1,
                         measure(directory, -1, root / "unused", args.texts, args.length)))
        for index, fraction in enumerate(args.budgets):
            budget = int(weights * fraction)
            rows.append((f"{fraction:g} of the weights, rest on disk", budget,
                         measure(directory, budget, root / f"offload-{index}", args.texts, args.length)))
        for name, budget, result in rows:
            print(f"| {name} | {_size(budget) if budget > 0 else '-'} | {_size(weights)} | {result['map']} "
                  f"| {_size(result['loaded'] - result['before'])} | {_size(result['peak'] - result['before'])} "
                  f"| {result['load_seconds']:.1f} s | {result['statistics_seconds']:.1f} s "
                  f"| {largest_difference(result['means'], whole['means']):.1e} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
