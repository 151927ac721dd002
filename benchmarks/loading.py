"""Peak memory and time of ``attnlab.load`` on a sharded ~1B-parameter Llama-style checkpoint.

A checkpoint of random bfloat16 weights is written into a temporary folder, in the layout
``transformers``' ``save_pretrained(max_shard_size=...)`` writes (``config.json``,
``model-0000k-of-0000n.safetensors`` shards and ``model.safetensors.index.json``): hidden
2048, 16 layers, 16 heads, feed-forward 6144, vocabulary 32000, untied LM head, 1.003B
parameters (2.0 GB in bfloat16). Each dtype is then loaded in a fresh process, which
reports its peak resident memory (``resource.getrusage(...).ru_maxrss``), its resident
memory before loading (Python, torch and attnlab imported), and the load time; they are
printed next to the model's size in that dtype (the files are read once before, so loads
are timed from the page cache). Tensors loaded in the dtype they are
stored in stay memory-mapped (copy-on-write pages of the file, read when first used), so
the peak after one forward pass of 8 tokens, which reads every weight, is printed too.
The folder is removed at the end.

Run (it writes 2 GB and needs ~6 GB of free memory for float32)::

    python benchmarks/loading.py
    python benchmarks/loading.py --dtypes bfloat16 --layers 4   # smaller and quicker
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from _child import run_child

GiB = 1024 ** 3
# A child's ru_maxrss starts from its parent's resident size at the fork, so the parent stays
# small: torch is imported only in the children, and a child of its own writes the checkpoint.
CHILD = r"""
import json, resource, sys, time
import torch
import attnlab
from attnlab._machine import machine_line
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
model = attnlab.load(sys.argv[1], dtype=sys.argv[2]).model
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with torch.no_grad():
    model(torch.arange(1, 9)[None])  # every weight read once
used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
parameters = {p.data_ptr(): p for p in model.parameters()}.values()
print(json.dumps({"seconds": seconds, "peak": peak, "before": before, "used": used,
                  "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in parameters}),
                  "bytes": sum(p.numel() * p.element_size() for p in parameters),
                  "machine": machine_line()}))
"""


def llama_tensors(hidden: int, layers: int, intermediate: int, vocab: int
                  ) -> list[tuple[str, tuple[int, ...]]]:
    """HuggingFace Llama tensor names and shapes, in the order ``save_pretrained`` writes them."""
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        layer = f"model.layers.{i}."
        shapes += [(layer + "input_layernorm.weight", (hidden,)),
                   (layer + "post_attention_layernorm.weight", (hidden,))]
        shapes += [(f"{layer}self_attn.{name}_proj.weight", (hidden, hidden)) for name in "qkvo"]
        shapes += [(layer + "mlp.gate_proj.weight", (intermediate, hidden)),
                   (layer + "mlp.up_proj.weight", (intermediate, hidden)),
                   (layer + "mlp.down_proj.weight", (hidden, intermediate))]
    return shapes + [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def write_checkpoint(directory: Path, *, hidden: int, layers: int, heads: int, intermediate: int, vocab: int,
                     shard_bytes: int) -> int:
    """Random bfloat16 weights in shards of at most ``shard_bytes``; returns the parameter count.

    One shard is held in memory at a time.
    """
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    weight_map: dict[str, int] = {}
    shard: dict[str, torch.Tensor] = {}
    size = count = 0
    files: list[str] = []

    def flush() -> None:
        nonlocal shard, size
        name = f"part-{len(files)}.safetensors"
        save_file(shard, str(directory / name), metadata={"format": "pt"})
        files.append(name)
        shard, size = {}, 0

    for name, shape in llama_tensors(hidden, layers, intermediate, vocab):
        if len(shape) == 1:
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensor = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        if shard and size + tensor.nbytes > shard_bytes:
            flush()
        shard[name] = tensor
        weight_map[name] = len(files)
        size += tensor.nbytes
        count += tensor.numel()
    flush()
    total = len(files)
    names = [f"model-{index + 1:05d}-of-{total:05d}.safetensors" for index in range(total)]
    for old, new in zip(files, names):
        (directory / old).rename(directory / new)
    index = {"metadata": {"total_size": 2 * count},
             "weight_map": {tensor: names[shard_index] for tensor, shard_index in weight_map.items()}}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 10000.0, "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "dtype": "bfloat16"}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return count


def load_in_child(directory: Path, dtype: str) -> dict:
    """``attnlab.load(directory, dtype=dtype)`` in a fresh interpreter; its measurements."""
    return json.loads(run_child(["-c", CHILD, str(directory), dtype], f"loading in {dtype}"))


def warm_page_cache(directory: Path) -> None:
    """Write the checkpoint out and read it once, so that loads are timed from the page
    cache, not from a disk still busy writing it (up to 4x slower here)."""
    os.sync()
    buffer = bytearray(8 * 2 ** 20)
    for path in sorted(directory.glob("*.safetensors")):
        with path.open("rb", buffering=0) as file:
            while file.readinto(buffer):
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate", type=int, default=6144)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-gb", type=float, default=1.0, help="largest shard, in GB (10^9 bytes)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32", "auto"])
    parser.add_argument("--dir", type=Path, default=None,
                        help="write the checkpoint here and keep it (default: a temporary folder, removed)")
    parser.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)  # the writing child
    args = parser.parse_args(argv)
    sizes = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, intermediate=args.intermediate,
                 vocab=args.vocab, shard_bytes=int(args.shard_gb * 1e9))
    if args.write_only:
        print(write_checkpoint(args.dir, **sizes))
        return 0
    directory = args.dir or Path(tempfile.mkdtemp(prefix="attnlab-loading-"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        forwarded = [f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items()
                     if name in ("hidden", "layers", "heads", "intermediate", "vocab", "shard_gb")]
        count = int(run_child([__file__, "--write-only", "--dir", str(directory), *forwarded], "writing"))
        shards = len(list(directory.glob("model-*-of-*.safetensors")))
        warm_page_cache(directory)
        print(f"checkpoint: Llama-style, {count / 1e9:.3f}B parameters, bfloat16, {shards} shards "
              f"({2 * count / GiB:.2f} GiB)")
        for index, dtype in enumerate(args.dtypes):
            result = load_in_child(directory, dtype)
            if index == 0:
                print(f"{result['machine']}; torch {result['torch']}")
                print("| dtype | model size | peak RSS loading | before loading | peak - before | load time "
                      "| peak RSS after a forward pass |")
                print("|---|---|---|---|---|---|---|")
            size = result["bytes"]
            peak, before = result["peak"], result["before"]
            print(f"| {dtype} ({'/'.join(result['dtypes'])}) | {size / GiB:.2f} GiB | {peak / GiB:.2f} GiB "
                  f"| {before / GiB:.2f} GiB | {(peak - before) / GiB:.2f} GiB | {result['seconds']:.1f} s "
                  f"| {result['used'] / GiB:.2f} GiB |")
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
