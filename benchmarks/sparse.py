"""Block-sparse attention on long inputs: time and peak memory against dense attention.

Usage (heavy: run it alone; one run takes a few minutes on 2 cores)::

    python benchmarks/sparse.py

Compares, for B=1, H=8, D=64, blocks of 128 and one neighbour block on each side:

* ``sparse``     attnlab's ``block_sparse_attention`` (the kernel of ``SparseAttention``)
* ``dense+mask`` ``F.scaled_dot_product_attention`` with the equivalent ``[T, T]`` bool mask
* ``dense``      ``F.scaled_dot_product_attention`` without a mask (all pairs; a floor for dense)
* ``flex``       ``torch.compile(flex_attention)`` with the same block mask, built by
                 ``BlockMask.from_kv_blocks`` (``create_block_mask`` evaluates all T^2 pairs)

``sparse`` runs on the block-sparse kernel path that ``ATTNLAB_SPARSE_KERNEL`` picks (``auto``:
AMX where the CPU has it, else the portable kernel, else torch's ops); the output names it,
with the CPU and how busy the machine was. ``--kernels amx portable torch`` times several
paths side by side in one process; ``--load N`` starts N competing busy processes for the run.

Method: every (method, T) runs in a fresh subprocess. Memory is the resident-set
high-water mark (``VmHWM``) minus the resident set just before the measured call,
after the inputs exist, a warm-up call has run (and compiled, for flex), freed heap has
been returned with ``malloc_trim(0)`` and the high-water mark reset through
``/proc/self/clear_refs``: it is the extra memory one call needs, inputs excluded.
Time is the median wall time of ``--repeats`` calls after the warm-up; dense attention
at ``T >= 16384`` runs once, without warm-up (it takes seconds). ``fwd+bwd`` is one
forward and ``backward`` of a fixed output gradient; ``fwd`` runs under ``no_grad``.
Linux only (``/proc``). Timings move 10-20 % between runs and with other load on the
machine: compare ratios from one run.

Finally a training step (AdamW) of a sparse ``TransformerEncoder`` (d_model 256,
4 layers, 4 heads, d_ff 1024) on one sequence of ``--train-length`` tokens is timed,
with the same memory method.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SOURCE))
from attnlab._dispatch import SPARSE_KERNEL_CHOICES as CHOICES  # noqa: E402
from attnlab._dispatch import SPARSE_KERNEL_VARIABLE as VARIABLE  # noqa: E402

METHODS = ("sparse", "flex", "dense+mask", "dense")


# ------------------------------------------------------------------ memory
def _proc_status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1))


def _reset_peak() -> int:
    """Return freed heap to the system, reset the RSS high-water mark; return RSS in KiB."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")
    return _proc_status_kib("VmRSS")


def _measure(call, repeats: int, warm_up: bool) -> dict:
    """Peak extra memory of one call and the median time of ``repeats`` calls."""
    if warm_up:
        call()
    baseline = _reset_peak()
    start = time.perf_counter()
    call()
    times = [time.perf_counter() - start]
    peak_mib = (_proc_status_kib("VmHWM") - baseline) / 1024
    for _ in range(repeats - 1):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"ms": 1000 * statistics.median(times), "peak_mib": peak_mib, "runs": len(times)}


# ------------------------------------------------------------------- child
def _block_mask_for_flex(T: int, block: int, window: int):
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    blocks = T // block
    index = torch.arange(blocks)
    neighbours = index[:, None] + torch.arange(-window, window + 1)  # [N, 2w + 1]
    inside = (neighbours >= 0) & (neighbours < blocks)
    counts = inside.sum(1).to(torch.int32)  # [N]
    # Valid neighbours first, then filler indices that the counts exclude.
    order = torch.argsort((~inside).to(torch.int8), dim=1, stable=True)
    kv_indices = torch.zeros(blocks, blocks, dtype=torch.int32)
    width = min(blocks, 2 * window + 1)  # counts never exceed either
    ordered = torch.gather(neighbours.clamp(0, blocks - 1), 1, order)[:, :width]
    kv_indices[:, :width] = ordered.to(torch.int32)
    return BlockMask.from_kv_blocks(
        counts[None, None], kv_indices[None, None], full_kv_num_blocks=None, BLOCK_SIZE=block
    )


def _random_inputs(T: int, args: argparse.Namespace):
    """Seeded ``q, k, v`` and an output gradient, each ``[1, H, T, D]`` in ``--dtype``."""
    import torch

    torch.manual_seed(0)
    shape, dtype = (1, args.heads, T, args.head_dim), getattr(torch, args.dtype)
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(4))


def run_child(method: str, T: int, args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(SOURCE))
    import torch
    import torch.nn.functional as F

    from attnlab.attention.sparse.block_sparse import block_sparse_attention, block_sparse_mask

    B, H, D, L, w = 1, args.heads, args.head_dim, args.block, args.window
    dtype = getattr(torch, args.dtype)
    q, k, v, grad_out = _random_inputs(T, args)
    once = method.startswith("dense") and T >= 16384
    repeats, warm_up = (1, False) if once else (args.repeats, True)
    result: dict = {"method": method, "T": T}

    if method == "sparse":
        def attend(q, k, v):
            return block_sparse_attention(q, k, v, block_size=L, window=w).output
    elif method == "dense+mask":
        mask = block_sparse_mask(T, L, w)  # [T, T] bool, True = may attend

        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    elif method == "dense":
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)
    else:
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = _block_mask_for_flex(T, L, w)
        compiled = torch.compile(flex_attention, dynamic=False)

        def attend(q, k, v):
            return compiled(q, k, v, block_mask=block_mask)

        start = time.perf_counter()
        with torch.no_grad():
            attend(q, k, v)
        result["compile_s"] = time.perf_counter() - start
        with torch.no_grad():
            reference = block_sparse_attention(q, k, v, block_size=L, window=w).output
            result["max_abs_diff_vs_sparse"] = (attend(q, k, v) - reference).abs().max().item()
            # The two forwards alternately in this process, so both see the same load.
            flex_times, sparse_times = [], []
            for _ in range(max(3, args.repeats)):
                for times, call in ((sparse_times, lambda: block_sparse_attention(q, k, v, block_size=L, window=w)),
                                    (flex_times, lambda: attend(q, k, v))):
                    start = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - start)
            result["side_by_side_sparse_over_flex"] = statistics.median(sparse_times) / statistics.median(flex_times)

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    result["fwd"] = _measure(forward, repeats, warm_up)
    leaves = [t.requires_grad_(True) for t in (q, k, v)]

    def forward_backward():
        attend(*leaves).backward(grad_out)
        for leaf in leaves:
            leaf.grad = None

    try:
        result["fwd+bwd"] = _measure(forward_backward, repeats, warm_up)
    except Exception as error:  # flex has no CPU backward in this torch
        result["fwd+bwd"] = {"skipped": f"{type(error).__name__}: {str(error).split('.')[0][:80]}"}
    return result


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "bfloat16": 2}[dtype]


def run_side_by_side_child(T: int, args: argparse.Namespace) -> dict:
    """Every kernel timed in turn in one process, so that all see the same load.

    Also measures the GEMM ceiling (a square matmul) and times the sparse kernel with
    key padding and global tokens against the unmasked call.
    """
    sys.path.insert(0, str(SOURCE))
    import torch
    import torch.nn.functional as F

    from attnlab.attention.sparse.block_sparse import block_sparse_attention

    B, H, D, L, w = 1, args.heads, args.head_dim, args.block, args.window
    dtype = getattr(torch, args.dtype)
    q, k, v, grad_out = _random_inputs(T, args)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    valid = torch.arange(T)[None] < T - T // 10  # the last tenth is padding
    global_positions = (0, T // 2)

    def sparse(q, k, v, masked=False):
        if masked:
            return block_sparse_attention(q, k, v, valid, block_size=L, window=w,
                                          global_positions=global_positions).output
        return block_sparse_attention(q, k, v, block_size=L, window=w).output

    def on_path(path, call):  # the block-sparse kernel path for this call alone
        if path is None:
            return call

        def run(*inputs):
            before = os.environ.get(VARIABLE)
            os.environ[VARIABLE] = path
            try:
                return call(*inputs)
            finally:
                if before is None:
                    del os.environ[VARIABLE]
                else:
                    os.environ[VARIABLE] = before
        return run

    kernels = {}
    for path in args.kernels or [None]:
        name = "sparse" if path is None else f"sparse[{path}]"
        kernels[name] = on_path(path, sparse)
        kernels[f"{name} masked"] = on_path(path, lambda q, k, v: sparse(q, k, v, masked=True))
    if "dense" in args.methods and T <= args.dense_max_len:
        kernels["dense"] = F.scaled_dot_product_attention
    result: dict = {"T": T}
    if "flex" in args.methods and not args.no_flex and T % L == 0:
        try:
            from torch.nn.attention.flex_attention import flex_attention

            block_mask = _block_mask_for_flex(T, L, w)
            compiled = torch.compile(flex_attention, dynamic=False)
            with torch.no_grad():
                compiled(q, k, v, block_mask=block_mask)
            kernels["flex"] = lambda q, k, v: compiled(q, k, v, block_mask=block_mask)
        except Exception as error:  # no compiler, or no CPU backend for this dtype
            result["flex_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"

    def forward(kernel):
        def call():
            with torch.no_grad():
                kernel(q, k, v)
        return call

    def forward_backward(kernel):
        def call():
            kernel(*leaves).backward(grad_out)  # the backward takes its forward's kernel path
            for leaf in leaves:
                leaf.grad = None
        return call

    size = 4096
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    calls = {"gemm": lambda: torch.mm(a, b)}
    for name, kernel in kernels.items():
        calls[f"{name} fwd"] = forward(kernel)
        if name != "flex":  # flex has no CPU backward
            calls[f"{name} fwd+bwd"] = forward_backward(kernel)
    for name, call in calls.items():
        if not name.startswith("dense"):  # dense takes seconds; its first call is no warm-up
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    result["ms"] = {name: 1000 * statistics.median(values) for name, values in times.items()}
    result["gemm_gflops"] = 2 * size**3 / (result["ms"]["gemm"] / 1000) / 1e9
    W = (2 * w + 1) * L
    result["sparse_fwd_gflop"] = 4 * B * H * T * W * D / 1e9  # Q K^T and P V over the windows
    result["dense_fwd_gflop"] = 4 * B * H * T * T * D / 1e9
    result["threads"] = torch.get_num_threads()
    result["kernels"] = args.kernels or [None]
    return result


def _print_side_by_side(result: dict, args: argparse.Namespace) -> None:
    ms, T = result["ms"], result["T"]
    print(f"T={T}, side by side in one process ({args.dtype}, {result['threads']} threads, "
          f"each call in turn, median of {args.repeats}):")
    ceiling = result["gemm_gflops"]
    for path in result.get("kernels", [None]):
        name = "sparse" if path is None else f"sparse[{path}]"
        for mode in ("fwd", "fwd+bwd"):
            mine = ms.get(f"{name} {mode}")
            parts = [f"{name} {mine:.1f} ms"]
            if f"dense {mode}" in ms:
                dense = ms[f"dense {mode}"]
                parts.append(f"dense (no mask) {dense:.0f} ms -> sparse is {dense / mine:.1f}x faster")
            if f"flex {mode}" in ms:
                flex = ms[f"flex {mode}"]
                parts.append(f"flex {flex:.1f} ms -> flex/sparse {flex / mine:.2f}x")
            masked = ms.get(f"{name} masked {mode}")
            parts.append(f"with key padding + 2 global tokens {masked:.1f} ms "
                         f"({masked / mine:.2f}x unmasked)")
            print(f"  {mode:8s} " + "; ".join(parts))
        fwd = result["sparse_fwd_gflop"] / (ms[f"{name} fwd"] / 1000)
        both = 3.5 * result["sparse_fwd_gflop"] / (ms[f"{name} fwd+bwd"] / 1000)
        print(f"  {name} reaches {fwd:.0f} GFLOP/s = {100 * fwd / ceiling:.0f} % of the GEMM ceiling "
              "forward, "
              f"{100 * both / ceiling:.0f} % fwd+bwd (counted as 3.5x the forward's GEMM work)")
    if "flex_error" in result:
        print(f"  flex: not run ({result['flex_error']})")
    line = f"  GEMM ceiling {ceiling:.0f} GFLOP/s (4096^2 {args.dtype} matmul, same process)"
    if "dense fwd" in ms:
        dense = result["dense_fwd_gflop"] / (ms["dense fwd"] / 1000)
        line += f"; dense flash forward {100 * dense / ceiling:.0f} % of it"
    print(line)


def run_train_child(args: argparse.Namespace) -> dict:
    sys.path.insert(0, str(SOURCE))
    import torch

    from attnlab import TransformerEncoder

    torch.manual_seed(0)
    T, vocab = args.train_length, 1000
    model = TransformerEncoder(
        vocab, d_model=args.train_d_model, num_layers=args.train_layers, num_heads=args.train_d_model // 64 or 1,
        d_ff=4 * args.train_d_model, dropout=0.1, max_len=T, attention="sparse", block_size=args.block,
        window=args.window, attention_dropout=0.0,
    )
    head = torch.nn.Linear(args.train_d_model, vocab)
    parameters = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=1e-4)
    ids = torch.randint(0, vocab, (1, T))
    targets = torch.randint(0, vocab, (1, T))

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = head(model(ids).last_hidden_state)  # [1, T, vocab]
        loss = torch.nn.functional.cross_entropy(logits.view(T, vocab), targets.view(T))
        loss.backward()
        optimizer.step()

    step()  # creates the optimizer state, so the measured step is a steady one
    parameter_count = sum(p.numel() for p in parameters)
    return {"method": "train", "T": T, "params": parameter_count, "step": _measure(step, args.train_repeats, False)}


# ------------------------------------------------------------------ parent
def _spawn(child_args: list[str], args: argparse.Namespace) -> dict:
    if args.in_process:
        try:
            if child_args[0] == "--train-child":
                return run_train_child(args)
            if child_args[0] == "--side-by-side-child":
                return run_side_by_side_child(int(child_args[1]), args)
            return run_child(child_args[1], int(child_args[2]), args)
        except Exception as error:
            return {"error": f"{type(error).__name__}: {error}"[:120]}
    command = [sys.executable, str(Path(__file__).resolve()), *child_args, *_shared_flags(args)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit code %d" % done.returncode])[-1][:120]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shared_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--block", str(args.block),
        "--window", str(args.window), "--repeats", str(args.repeats), "--methods", *args.methods,
        "--train-length", str(args.train_length), "--train-d-model", str(args.train_d_model),
        "--train-layers", str(args.train_layers), "--train-repeats", str(args.train_repeats),
        "--dtype", args.dtype, "--threads", str(args.threads), *(["--no-flex"] if args.no_flex else []),
        "--dense-max-len", str(args.dense_max_len), *(["--kernels", *args.kernels] if args.kernels else []),
    ]


def _skip_reason(method: str, T: int, args: argparse.Namespace) -> str | None:
    if method == "flex" and args.no_flex:
        return "--no-flex"
    if method == "flex" and T % args.block:
        return "T must be a multiple of the block for this block mask"
    if method.startswith("dense"):
        # The bool mask is T^2 bytes and SDPA turns it into a T^2 float mask.
        mask_gib = 5 * T * T / 2**30 if method == "dense+mask" else 0.0
        if mask_gib > args.memory_budget_gib:
            return f"mask needs ~{mask_gib:.0f} GiB > budget {args.memory_budget_gib:g} GiB"
        if T > args.dense_max_len:
            return f"T^2 time: ~{(T / 16384) ** 2:.0f}x the 16k run (--dense-max-len {args.dense_max_len})"
    return None


def _cell(measure: dict | None) -> tuple[str, str]:
    if not measure:
        return "-", "-"
    if "skipped" in measure:
        return "n/a", "n/a"
    return f"{measure['ms']:.1f}", f"{measure['peak_mib']:.0f}"


def _fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares slope, intercept and R^2."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys) or 1.0
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    return slope, intercept, 1 - residual / total


def run_parent(args: argparse.Namespace) -> int:
    from attnlab._machine import machine_line
    from attnlab._dispatch import sparse_kernel_path

    print(f"B=1 H={args.heads} D={args.head_dim} block={args.block} window=±{args.window} blocks, "
          f"{args.dtype}, "
          f"{args.repeats} timed runs (median); memory = extra RSS high-water over the inputs")
    print(machine_line(args.load))
    print(f"block-sparse kernel path ({args.dtype} takes it where the path serves {args.dtype}): "
          f"{sparse_kernel_path()}" + (f"; side by side: {', '.join(args.kernels)}" if args.kernels else ""))
    header = f"{'T':>6} {'method':<11} {'fwd ms':>9} {'fwd MiB':>8} {'fwd+bwd ms':>11} {'f+b MiB':>8}  note"
    print(header)
    print("-" * len(header))
    results: dict[tuple[str, int], dict] = {}
    for T in args.lengths:
        for method in args.methods:
            reason = _skip_reason(method, T, args)
            if reason is None:
                result = _spawn(["--child", method, str(T)], args)
            else:
                result = {"skipped": reason}
            results[method, T] = result
            fwd_ms, fwd_mib = _cell(result.get("fwd"))
            fb_ms, fb_mib = _cell(result.get("fwd+bwd"))
            note = result.get("skipped") or result.get("error") or ""
            if "skipped" in result.get("fwd+bwd", {}):
                note = "fwd+bwd: " + result["fwd+bwd"]["skipped"]
            if "compile_s" in result:
                note = f"compile {result['compile_s']:.1f} s; " + note
            if "max_abs_diff_vs_sparse" in result:
                note += f"; |diff vs sparse| {result['max_abs_diff_vs_sparse']:.1e}"
            if "side_by_side_sparse_over_flex" in result:
                note = f"fwd side by side: sparse/flex {result['side_by_side_sparse_over_flex']:.2f}; " + note
            print(f"{T:>6} {method:<11} {fwd_ms:>9} {fwd_mib:>8} {fb_ms:>11} {fb_mib:>8}  {note}", flush=True)

    print()
    _summarise(results, args)
    if "sparse" in args.methods and not args.no_side_by_side:
        for T in args.lengths:
            if T > args.side_by_side_max_len:
                continue
            side = _spawn(["--side-by-side-child", str(T)], args)
            if "error" in side:
                print(f"T={T}, side by side: failed: {side['error']}")
            else:
                _print_side_by_side(side, args)
    if args.train_length:
        train = _spawn(["--train-child"], args)
        if "error" in train:
            print(f"training step: failed: {train['error']}")
        else:
            step = train["step"]
            print(f"training step, sparse encoder d_model={args.train_d_model} layers={args.train_layers} "
                  f"T={train['T']} B=1 ({train['params'] / 1e6:.1f} M parameters, AdamW): "
                  f"{step['ms'] / 1000:.2f} s/step (median of {step['runs']}), peak extra memory "
                  f"{step['peak_mib'] / 1024:.2f} GiB")
    return 0


def _summarise(results: dict, args: argparse.Namespace) -> None:
    def value(method: str, T: int, mode: str, field: str = "ms") -> float | None:
        measure = results.get((method, T), {}).get(mode)
        return None if not measure or "skipped" in measure else measure[field]

    for T in args.lengths:
        parts = []
        for mode in ("fwd+bwd", "fwd"):
            mine, dense = value("sparse", T, mode), value("dense+mask", T, mode)
            if mine and dense:
                parts.append(f"{mode} speed-up vs dense+mask {dense / mine:.1f}x")
        mine, flex = value("sparse", T, "fwd"), value("flex", T, "fwd")
        if mine and flex:
            parts.append(f"fwd time sparse/flex {mine / flex:.2f}")
        if parts:
            print(f"T={T}: " + "; ".join(parts))
    points = [(T, value("sparse", T, "fwd+bwd", "peak_mib")) for T in args.lengths]
    points = [(T, mib) for T, mib in points if mib is not None]
    if len(points) >= 2:
        slope, intercept, r2 = _fit_line([T for T, _ in points], [mib for _, mib in points])
        print(f"sparse fwd+bwd peak memory ~ {intercept:.1f} MiB + {slope * 1024:.2f} MiB per 1k tokens "
              f"({slope * 1024:.0f} KiB/token), R^2 = {r2:.4f} over T = {[T for T, _ in points]}")
        T, mib = points[-1]
        tensor_mib = _itemsize(args.dtype) * args.heads * args.head_dim * T / 2**20  # one [T, H, D] tensor
        print(f"  at T={T}: {mib / 1024:.2f} GiB = {mib / tensor_mib:.1f}x one [T, H, D] {args.dtype} tensor")
    points = [(T, value("sparse", T, "fwd+bwd")) for T in args.lengths if T >= 4096]
    points = [(T, ms) for T, ms in points if ms is not None]
    if len(points) >= 2:
        slope, intercept, r2 = _fit_line([T for T, _ in points], [ms for _, ms in points])
        print(f"sparse fwd+bwd time ~ {intercept:.1f} ms + {slope * 1024:.2f} ms per 1k tokens, "
              f"R^2 = {r2:.4f} "
              f"over T = {[T for T, _ in points]} (separate processes, one after another)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--window", type=int, default=1, help="neighbour blocks on each side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-side-by-side", action="store_true", help="skip the one-process timing")
    parser.add_argument("--side-by-side-max-len", type=int, default=16384, help="longest side-by-side T")
    parser.add_argument("--dense-max-len", type=int, default=16384, help="longest T for dense attention")
    parser.add_argument("--memory-budget-gib", type=float, default=12.0, help="skip dense masks above this")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (compiling takes a while)")
    parser.add_argument("--kernels", nargs="+", choices=[c for c in CHOICES if c != "auto"], default=None,
                        help="block-sparse kernel paths to time side by side in one process "
                             f"(default: the one {VARIABLE} picks)")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes for the run (competing load; they stop with it)")
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)  # older flag; always on now
    parser.add_argument("--train-length", type=int, default=16384, help="0 skips the training step")
    parser.add_argument("--train-d-model", type=int, default=256)
    parser.add_argument("--train-layers", type=int, default=4)
    parser.add_argument("--train-repeats", type=int, default=1, help="timed steps after one warm-up step")
    parser.add_argument(
        "--in-process", action="store_true",
        help="quick check: run every case in this process (memory figures are then not comparable)",
    )
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "T"), help=argparse.SUPPRESS)
    parser.add_argument("--side-by-side-child", type=int, metavar="T", help=argparse.SUPPRESS)
    parser.add_argument("--train-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(run_child(args.child[0], int(args.child[1]), args)))
        return 0
    if args.train_child:
        print(json.dumps(run_train_child(args)))
        return 0
    if args.side_by_side_child:
        print(json.dumps(run_side_by_side_child(args.side_by_side_child, args)))
        return 0
    from attnlab._machine import competing_load

    with competing_load(args.load):
        return run_parent(args)


if __name__ == "__main__":
    sys.exit(main())
