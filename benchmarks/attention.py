"""Speed and memory of attnlab's attention and encoder against a naive reference and torch.nn.

Run ``make bench`` or ``python benchmarks/attention.py [--quick] [--sections mha encoder]``.

Sections
--------
``mha``: one self-attention module, ``E = 512``, ``H = 8``, ``D = 64``, at
``T = 256, 1024, 4096`` (``B = 4, 4, 2``):

* ``attnlab fused``    - ``attnlab.MultiHeadAttention``, ``need_weights=False``
  (one QKV projection, ``F.scaled_dot_product_attention``);
* ``attnlab weights``  - the same module with ``need_weights=True`` (explicit
  matmul -> softmax -> matmul that also returns per-head weights);
* ``naive``            - the article's code pattern, written out below
  (four ``Linear`` layers, matmul -> softmax -> matmul, ``-1e9`` masking);
* ``torch.nn.MHA``     - ``torch.nn.MultiheadAttention(batch_first=True)`` called with
  ``need_weights=False``.

All four share the same weights; the table shows the largest output difference from
``attnlab fused`` as a sanity check. Every module has dropout 0.

* ``fwd``: inference, ``module.eval()`` under ``torch.no_grad()``. This is where
  ``torch.nn.MultiheadAttention`` takes its native fast path
  (``_native_multi_head_attention``), which builds the ``T x S`` matrix.
* ``fwd+bwd``: ``module.train()``, forward, then ``backward`` of a fixed output
  gradient through the module's parameters and its input.

``encoder``: one training step (forward, backward, ``Adam.step``) of a 6-layer encoder,
``B = 8``, ``T = 512``, ``d_model = 512``, 8 heads, ``d_ff = 2048``, vocabulary 30522, GELU,
in float32 and under ``torch.autocast("cpu", torch.bfloat16)``, reported as tokens/s:

* ``torch.nn``: ``nn.Embedding`` scaled by ``sqrt(d_model)`` + attnlab's sinusoidal
  positions + dropout, then ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer``
  (post-norm, GELU, ``batch_first``) and a final ``LayerNorm`` - the same embedding,
  shape and regularisation as attnlab's encoder. ``dropout=0.1`` there also drops
  attention probabilities.
* ``torch.nn, attention dropout 0``: the same, with its attention-probability dropout
  set to 0 (everything else 0.1) - the regularisation of attnlab's default.
* ``attnlab, attention_dropout=0.1``: ``attnlab.TransformerEncoder`` with the same
  regularisation as ``torch.nn``.
* ``attnlab default``: ``attnlab.TransformerEncoder(vocab_size)`` as it comes
  (``attention_dropout=0``, see ``EncoderConfig``).

The loss is the mean square of the last hidden state, the same for every model.

On a CPU without native bfloat16 (no AVX512-BF16 or AMX; the start line says) torch
emulates bfloat16 matrix multiplication and one ``torch.nn`` step under bf16 autocast
takes minutes, so ``make bench`` skips the bf16 rows there; time them with
``--force-bf16 --sections encoder --dtypes bf16 --encoder-models torch attnlab
--warmup 0 --enc-repeats 1``. attnlab's ``Linear`` layers compute bfloat16 products
with float32 GEMMs on such CPUs (see ``attnlab/_precision.py``).

Method
------
* Time: the compared implementations of one table row group are built in one process
  and run *interleaved* (A, B, C, D, A, B, ...) after warm-up, so a busy machine slows
  all of them alike; each figure is the median of the repeats. Ratios come from the
  same run. Two threads (torch's default here) unless the machine says otherwise.
* Peak memory (``mha`` only): every case runs once in a *fresh* Python process. After
  building the module and inputs and one warm-up call on a tiny input (lazy
  initialisation), the process returns freed heap memory to the system
  (``malloc_trim``), resets the kernel's resident-set high-water mark
  (``/proc/self/clear_refs``), runs the case once and reports ``VmHWM - VmRSS`` from
  before the call: the extra resident memory the call needed at its peak, outputs,
  saved activations and gradients included. Python's ``tracemalloc`` does not see
  torch's allocations, hence the resident set. Where the high-water mark cannot be
  reset, ``ru_maxrss`` is used instead (the method is printed).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

_SRC = Path(__file__).resolve().parents[1] / "src"
if _SRC.is_dir():
    sys.path.insert(0, str(_SRC))  # benchmark the checkout this file lives in

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from attnlab import MultiHeadAttention, TransformerEncoder  # noqa: E402
from attnlab.layers.positional import PositionalEncoding  # noqa: E402
from attnlab._machine import competing_load, machine_line
from attnlab._dispatch import paths_line  # noqa: E402
from attnlab._precision import cpu_has_native_bf16  # noqa: E402

MIB = 1024 * 1024
MHA_IMPLS = ("attnlab fused", "attnlab weights", "naive", "torch.nn.MHA")
MODES = ("fwd", "fwd+bwd")
DTYPES = ("fp32", "bf16")
ENCODER_MODELS = ("torch", "torch-attn0", "attnlab-attn0.1", "attnlab")


# --------------------------------------------------------------------------- the naive reference


class NaiveMultiHeadAttention(nn.Module):
    """The article's multi-head attention, as written there (dropout on the weights).

    Shape:
        ``x`` ``[B, T, E]`` -> ``(output [B, T, E], weights [B, H, T, T])``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.depth = d_model // num_heads
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.dense = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _split_heads(self, x: Tensor) -> Tensor:
        B = x.shape[0]
        return x.view(B, -1, self.num_heads, self.depth).transpose(1, 2)  # [B, H, T, D]

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        B = x.shape[0]
        query = self._split_heads(self.wq(x))
        key = self._split_heads(self.wk(x))
        value = self._split_heads(self.wv(x))
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.depth)  # [B, H, T, T]
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        weights = self.dropout(F.softmax(scores, dim=-1))
        output = torch.matmul(weights, value)  # [B, H, T, D]
        output = output.transpose(1, 2).contiguous().view(B, -1, self.d_model)  # [B, T, E]
        return self.dense(output), weights


def _copy_weights(source: MultiHeadAttention, target: nn.Module) -> None:
    """Give ``target`` the projections of ``source`` (naive or torch.nn layout)."""
    with torch.no_grad():
        if isinstance(target, NaiveMultiHeadAttention):
            for linear, weight, bias in zip(
                (target.wq, target.wk, target.wv),
                source.in_proj_weight.chunk(3),
                source.in_proj_bias.chunk(3),
            ):
                linear.weight.copy_(weight)
                linear.bias.copy_(bias)
            target.dense.load_state_dict(source.out_proj.state_dict())
        else:
            target.load_state_dict(source.state_dict(), strict=False)


# --------------------------------------------------------------------------- MHA cases


@dataclass(frozen=True)
class MhaCase:
    """One MHA measurement: implementation, mode and sizes."""

    impl: str
    mode: str
    batch: int
    length: int
    d_model: int
    num_heads: int


def _build_mha(case: MhaCase) -> tuple[dict[str, nn.Module], Callable[[nn.Module, Tensor, str], Tensor]]:
    """All four modules with shared weights, and a function calling one of them."""
    fused = MultiHeadAttention(case.d_model, case.num_heads, dropout=0.0)
    naive = NaiveMultiHeadAttention(case.d_model, case.num_heads)
    reference = nn.MultiheadAttention(case.d_model, case.num_heads, dropout=0.0, batch_first=True)
    _copy_weights(fused, naive)
    _copy_weights(fused, reference)
    modules = {"attnlab fused": fused, "attnlab weights": fused, "naive": naive, "torch.nn.MHA": reference}

    def call(module: nn.Module, x: Tensor, impl: str) -> Tensor:
        if impl == "attnlab fused":
            return module(x, x, x)[0]
        if impl == "attnlab weights":
            return module(x, x, x, need_weights=True)[0]
        if impl == "naive":
            return module(x)[0]
        return module(x, x, x, need_weights=False)[0]

    return modules, call


def _mha_runner(case: MhaCase, module: nn.Module, call, x: Tensor, grad: Tensor) -> Callable[[], Tensor]:
    """A no-argument function that runs ``case`` once and returns the output."""
    if case.mode == "fwd":
        module.eval()

        def run() -> Tensor:
            with torch.no_grad():
                return call(module, x, case.impl)

        return run
    module.train()
    x = x.detach().requires_grad_(True)

    def run_backward() -> Tensor:
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = call(module, x, case.impl)
        out.backward(grad)
        return out.detach()

    return run_backward


def _mha_inputs(case: MhaCase, length: Optional[int] = None) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (case.batch, length or case.length, case.d_model)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


# --------------------------------------------------------------------------- peak memory


def _rss_bytes(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_high_water_mark() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # "5": reset the peak resident set size (Linux >= 4.0)
        return True
    except OSError:
        return False


def _trim_heap() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measure_peak_memory(case: MhaCase) -> dict:
    """Run ``case`` once in this process and return its peak extra resident memory.

    Meant for a fresh process (see :func:`peak_memory_in_subprocess`).
    """
    torch.manual_seed(0)
    modules, call = _build_mha(case)
    module = modules[case.impl]
    tiny_x, tiny_grad = _mha_inputs(case, length=8)
    _mha_runner(case, module, call, tiny_x, tiny_grad)()  # lazy initialisation only
    x, grad = _mha_inputs(case)
    run = _mha_runner(case, module, call, x, grad)
    _trim_heap()
    before = _rss_bytes("VmRSS")
    if before is not None and _reset_high_water_mark():
        run()
        return {"peak_extra": _rss_bytes("VmHWM") - before, "method": "VmHWM after clear_refs"}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_extra": after - before, "method": "ru_maxrss (peak since start)"}


def peak_memory_in_subprocess(case: MhaCase) -> dict:
    """:func:`measure_peak_memory` in a fresh Python process; ``{"peak_extra", "method"}``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-case", json.dumps(asdict(case))]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"memory measurement of {case} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median (reported) and the fastest repeat (a noise gauge)."""

    median: float
    fastest: float


def interleaved_timings(runs: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, Timing]:
    """Time each run, calling them in turn (A, B, C, A, B, C, ...) after warm-up."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: Timing(statistics.median(values), min(values)) for name, values in seconds.items()}


# --------------------------------------------------------------------------- MHA section


def bench_mha(args: argparse.Namespace) -> None:
    print(f"\n## Multi-head self-attention, E={args.d_model}, H={args.heads}, D={args.d_model // args.heads}")
    print("time: median of %d interleaved repeats (%d at T >= 4096) after %d warm-up; memory: %s" % (
        args.repeats, max(2, args.repeats // 2), args.warmup,
        "peak extra resident memory of one call in a fresh process" if args.memory else "not measured"))
    for mode in args.modes:
        label = "inference: eval() + no_grad()" if mode == "fwd" else "training: forward + backward"
        print(f"\n### {mode} ({label})")
        header = (f"{'T':>5} {'B':>2}  {'implementation':<16} {'time ms':>9} {'min ms':>9} {'vs nn.MHA':>9} "
                  f"{'peak MiB':>9} {'vs naive':>8} {'max|diff|':>9}")
        print(header)
        print("-" * len(header))
        methods = set()
        for length, batch in zip(args.lengths, args.batches):
            cases = {impl: MhaCase(impl, mode, batch, length, args.d_model, args.heads) for impl in MHA_IMPLS}
            torch.manual_seed(0)
            modules, call = _build_mha(cases["attnlab fused"])
            x, grad = _mha_inputs(cases["attnlab fused"])
            runs = {impl: _mha_runner(case, modules[impl], call, x, grad) for impl, case in cases.items()}
            outputs = {impl: run() for impl, run in runs.items()}
            repeats = max(2, args.repeats // 2) if length >= 4096 else args.repeats
            times = interleaved_timings(runs, args.warmup, repeats)
            memory = {}
            if args.memory:
                memory = {impl: peak_memory_in_subprocess(case) for impl, case in cases.items()}
                methods.update(result["method"] for result in memory.values())
            for impl in MHA_IMPLS:
                diff = (outputs[impl] - outputs["attnlab fused"]).abs().max().item()
                peak = memory[impl]["peak_extra"] / MIB if memory else float("nan")
                naive_peak = memory["naive"]["peak_extra"] / MIB if memory else float("nan")
                timing, reference = times[impl], times["torch.nn.MHA"]
                print(f"{length:>5} {batch:>2}  {impl:<16} {timing.median * 1e3:>9.1f} {timing.fastest * 1e3:>9.1f} "
                      f"{timing.median / reference.median:>8.2f}x {peak:>9.1f} "
                      f"{peak / naive_peak if memory else float('nan'):>7.2f}x {diff:>9.1e}")
            del modules, runs, outputs, x, grad
            gc.collect()
        if methods:
            print(f"(memory method: {', '.join(sorted(methods))})")


# --------------------------------------------------------------------------- encoder section


class TorchEncoder(nn.Module):
    """attnlab's embedding (scaled token embedding + sinusoidal positions + dropout) in
    front of ``torch.nn.TransformerEncoder`` with a final ``LayerNorm``.

    Shape:
        ``input_ids`` ``[B, T]`` -> ``[B, T, E]``.
    """

    def __init__(self, vocab_size: int, d_model: int, num_layers: int, num_heads: int, d_ff: int,
                 dropout: float = 0.1, *, attention_dropout: Optional[float] = None) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_encoding = PositionalEncoding(d_model, max_len=5000)
        self.dropout = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(
            d_model, num_heads, d_ff, dropout, activation="gelu", batch_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, num_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        if attention_dropout is not None:
            for encoder_layer in self.encoder.layers:
                encoder_layer.self_attn.dropout = attention_dropout  # read on every forward

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.embedding(input_ids) * math.sqrt(self.d_model)  # [B, T, E]
        return self.encoder(self.dropout(self.pos_encoding(x)))


def _hidden(output) -> Tensor:
    return output if isinstance(output, Tensor) else output[0]  # torch.nn gives a tensor, attnlab an output


def _encoder_models(args: argparse.Namespace) -> dict[str, nn.Module]:
    shape = (args.vocab, args.enc_d_model, args.enc_layers, args.enc_heads, args.enc_d_ff)
    builders = {
        "torch": ("torch.nn (dropout 0.1 incl. attention)", lambda: TorchEncoder(*shape, 0.1)),
        "torch-attn0": ("torch.nn, attention dropout 0", lambda: TorchEncoder(*shape, 0.1, attention_dropout=0.0)),
        "attnlab-attn0.1": ("attnlab, attention_dropout=0.1",
                            lambda: TransformerEncoder(*shape, dropout=0.1, attention_dropout=0.1)),
        "attnlab": ("attnlab default", lambda: TransformerEncoder(*shape)),
    }
    torch.manual_seed(0)
    return {builders[key][0]: builders[key][1]() for key in args.encoder_models}


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, ids: Tensor, bf16: bool) -> Callable[[], None]:
    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _hidden(model(ids)).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_encoder(args: argparse.Namespace) -> None:
    B, T = args.enc_batch, args.enc_length
    print(f"\n## Encoder training step: B={B}, T={T}, d_model={args.enc_d_model}, heads={args.enc_heads}, "
          f"d_ff={args.enc_d_ff}, layers={args.enc_layers}, vocab={args.vocab}, GELU, Adam")
    print(f"tokens/s = B*T / median step time of {args.enc_repeats} interleaved repeats "
          f"after {args.warmup} warm-up; ratios are speed-ups (higher = faster than the reference)")
    baseline, same_attention = "torch.nn (dropout 0.1 incl. attention)", "torch.nn, attention dropout 0"
    for dtype in args.dtypes:
        if dtype == "bf16" and not (cpu_has_native_bf16() or args.quick or args.force_bf16):
            print("\n### bfloat16 autocast: skipped - this CPU has no native bfloat16 matrix multiply "
                  "(AVX512-BF16 or AMX). torch emulates it (a Linear 4096x512->2048 backward takes 11 s "
                  "instead of 0.18 s), so one torch.nn training step takes minutes; attnlab's Linear "
                  "layers use float32 GEMMs there. --force-bf16 times it anyway.")
            continue
        models = _encoder_models(args)
        ids = torch.randint(1, args.vocab, (B, T), generator=torch.Generator().manual_seed(0))
        steps = {}
        for name, model in models.items():
            model.train()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            steps[name] = _train_step(model, optimizer, ids, dtype == "bf16")
        times = interleaved_timings(steps, args.warmup, args.enc_repeats)
        label = "float32" if dtype == "fp32" else "bfloat16 autocast"
        print(f"\n### {label}")
        header = (f"{'model':<40} {'step ms':>9} {'min ms':>9} {'tokens/s':>9} {'vs torch.nn':>11} "
                  f"{'vs torch.nn attn-drop 0':>23} {'vs torch.nn (min)':>17}")
        print(header)
        print("-" * len(header))
        missing = Timing(float("nan"), float("nan"))
        for name in models:
            timing = times[name]
            reference, same = times.get(baseline, missing), times.get(same_attention, missing)
            print(f"{name:<40} {timing.median * 1e3:>9.0f} {timing.fastest * 1e3:>9.0f} "
                  f"{B * T / timing.median:>9.0f} {reference.median / timing.median:>10.2f}x "
                  f"{same.median / timing.median:>22.2f}x "
                  f"{reference.fastest / timing.fastest:>16.2f}x")
        del models, steps
        gc.collect()


# --------------------------------------------------------------------------- command line


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and one repeat: checks that everything runs, measures nothing")
    parser.add_argument("--sections", nargs="+", choices=("mha", "encoder"), default=["mha", "encoder"])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="MHA modes")
    parser.add_argument("--lengths", nargs="+", type=int, help="MHA sequence lengths (default 256 1024 4096)")
    parser.add_argument("--batches", nargs="+", type=int, help="MHA batch per length (default 4 4 2)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="encoder dtypes")
    parser.add_argument("--encoder-models", nargs="+", choices=ENCODER_MODELS, default=list(ENCODER_MODELS),
                        help="encoder rows (torch: torch.nn with dropout 0.1 everywhere; torch-attn0: its "
                             "attention dropout 0; attnlab-attn0.1; attnlab: attnlab's defaults)")
    parser.add_argument("--repeats", type=int, default=5, help="MHA timed repeats (halved, at least 2, at T >= 4096)")
    parser.add_argument("--enc-repeats", type=int, default=4, help="encoder timed steps per model")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--force-bf16", action="store_true",
                        help="time bfloat16 autocast even on a CPU that emulates it (minutes per step)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--load", type=int, default=0, metavar="N",
                        help="start N busy processes for the run (competing load; they stop with it)")
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the peak-memory subprocesses")
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)  # internal: one memory measurement
    args = parser.parse_args(argv)
    sizes = dict(d_model=512, heads=8, vocab=30522, enc_batch=8, enc_length=512, enc_d_model=512,
                 enc_heads=8, enc_d_ff=2048, enc_layers=6, lengths=[256, 1024, 4096], batches=[4, 4, 2])
    if args.quick:
        sizes = dict(d_model=32, heads=4, vocab=100, enc_batch=2, enc_length=16, enc_d_model=32,
                     enc_heads=4, enc_d_ff=64, enc_layers=2, lengths=[16, 32], batches=[2, 2])
        args.repeats = args.enc_repeats = 1
    for name, value in sizes.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if len(args.batches) == 1:
        args.batches = args.batches * len(args.lengths)
    if len(args.batches) != len(args.lengths):
        parser.error(f"--batches needs one value or one per length ({len(args.lengths)}), got {args.batches}")
    return args


def _machine(competing: int) -> str:
    bf16 = "native" if cpu_has_native_bf16() else "emulated (no AVX512-BF16/AMX)"
    return f"torch {torch.__version__}, bfloat16 matmul {bf16}; {machine_line(competing)}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # tables appear as they are measured
    if args.memory_case:
        print(json.dumps(measure_peak_memory(MhaCase(**json.loads(args.memory_case)))))
        return 0
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with competing_load(args.load):
            print(f"# attnlab benchmarks ({'quick smoke run' if args.quick else 'full'})")
            print(f"start: {_machine(args.load)}")
            print(paths_line())
            if "mha" in args.sections:
                bench_mha(args)
            if "encoder" in args.sections:
                bench_encoder(args)
            print(f"\nend: {_machine(args.load)}")
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
