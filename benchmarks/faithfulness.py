"""How faithful is each explanation method? Deletion and insertion AOPC, soft comprehensiveness and
sufficiency, beside a random ranking, with 95 % intervals over the texts.

For every text, each method of the model's kind (``token_attribution.METHODS`` for classifiers,
``generation_attribution.GENERATION_METHODS`` for decoders, read when the benchmark runs) and a
random ranking (uniform random scores, a fixed seed per text) score the text's tokens; special
tokens (``[CLS]``/``[SEP]``/``<bos>``) are never ranked and always stay. The explained quantity
``q`` is a classifier's probability of the class it predicts on the whole text, or a decoder's
``log p(next token)`` (nats) of the token it predicts after the prompt (the text's first
``--prompt-tokens`` tokens). The measures (``_faithfulness_measures.py`` defines them exactly):

* deletion AOPC: mean over k = 0, 10, ..., 100 % of ``q(x) - q(x without its top k %)``, tokens
  deleted (the sequence gets shorter); higher is more faithful.
* insertion AOPC: mean over k of ``q(only the top k %, in order) - q(none)``; higher is more faithful.
* soft comprehensiveness / sufficiency (Zhao & Aletras 2023): ``q(x) - q(x')`` with the token
  embeddings' elements kept by Bernoulli masks of probability ``1 - s_i`` / ``s_i`` (``s`` the
  min-max normalised scores), the mean of ``--draws`` masks; comprehensiveness higher, sufficiency
  lower is more faithful.

Each cell of the tables is ``mean [low, high]``: the mean over the texts and its 95 % interval,
``mean ± t(0.975, n - 1) · sd / √n``; ``*`` marks a method whose interval does not clear the random
ranking's on that measure (at or below random). The CPU and each model's seconds are printed.

Models: by default SmolLM2-135M-Instruct (``--decoder smollm2``), Gemma 3 270M (``--decoder
gemma3-270m``) and MiniLM (``--model minilm``: all-MiniLM-L6-v2 fine-tuned here on the first
``--finetune-examples`` texts of the packaged Rotten Tomatoes train split for ``--finetune-epochs``
epochs, once, into ``OUT/minilm-run``, then reused; its test accuracy is printed). ``--model DIR``
and ``--decoder SPEC`` (repeatable) take any classifier directory and any decoder attnlab opens;
``--model demo`` trains the from-scratch demo classifier into ``OUT/demo-run``. Texts: the packaged
Rotten Tomatoes test split. Writes ``OUT/faithfulness.json`` (every figure, per-method seconds, the
integrated-gradients completeness gap), ``OUT/faithfulness.png``; ``--record PATH`` writes the
figures in the format of ``attnlab/inspect/faithfulness.json``, the package's file::

    python benchmarks/faithfulness.py --record src/attnlab/inspect/faithfulness.json   # ~30 min, 2 cores
    python benchmarks/faithfulness.py --decoder smollm2 --texts 20 --out faithfulness-lm/
    python benchmarks/faithfulness.py --quick --model runs/my-classifier               # a smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the measures beside this script

from _faithfulness_measures import MEASURES, Quantity, interval, measure_input  # noqa: E402

from attnlab._files import write_json  # noqa: E402
from attnlab.data import load_rotten_tomatoes  # noqa: E402
from attnlab.inspect.faithfulness import FamilyFaithfulness, model_family  # noqa: E402

SPECIAL = {"[CLS]", "[SEP]", "<s>", "</s>", "[BOS]", "[EOS]"}
ABOUT = {
    "deletion_aopc": (True, "mean drop of the explained quantity as the top k % tokens are deleted, "
                            "k = 0..100 step 10"),
    "insertion_aopc": (True, "mean rise of the explained quantity over the input without its word tokens "
                             "as only the top k % tokens are kept in their order, k = 0..100 step 10"),
    "soft_comprehensiveness": (True, "drop of the explained quantity when each token's embedding elements "
                                     "are kept with probability 1 - its min-max normalised score (Zhao & "
                                     "Aletras 2023; mean of Bernoulli draws)"),
    "soft_sufficiency": (False, "drop of the explained quantity when each token's embedding elements are "
                                "kept with probability its min-max normalised score (Zhao & Aletras 2023; "
                                "mean of Bernoulli draws)"),
}
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3-270m": "Gemma 3 270M"}


def cpu_description() -> str:
    """The CPU's model name, its widest vector extension, and the cores this process may use."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            if key.strip() == "flags" and not flags:
                flags = value
    except OSError:
        pass
    words = flags.split()
    vector = next((label for flag, label in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
                   if flag in words), None)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name}{f' ({vector})' if vector else ''}, {cores} cores"


def train_demo_model(out: Path, epochs: int) -> Path:
    """A from-scratch classifier with the demo's architecture (``attnlab train`` defaults)."""
    from attnlab.train.run import train_run
    from attnlab.train.run_config import RunConfig

    config = lambda: RunConfig().with_overrides([f"train.epochs={epochs}"])  # noqa: E731
    return _trained(out / "demo-run", config, train_run)


def finetune_minilm(out: Path, examples: int, epochs: int) -> Path:
    """MiniLM fine-tuned by attnlab's recipe (``model.pretrained = "minilm"``) on the first
    ``examples`` training texts for ``epochs`` epochs, into ``out/minilm-run`` (reused when there)."""
    from attnlab.train.run import train_run
    from attnlab.train.run_config import resolve_run_config

    overrides = ['model.pretrained="minilm"', f"data.train_limit={examples}", f"train.epochs={epochs}",
                 "train.warmup_steps=20"]  # the recipe's 100 warm-up steps are most of a short run
    return _trained(out / "minilm-run", lambda: resolve_run_config(None, overrides), train_run)


def _trained(run_dir: Path, config: Callable[[], Any], train_run: Callable) -> Path:
    if (run_dir / "test_report.json").is_file():
        print(f"reusing {run_dir}")
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted run is started again
    started = time.perf_counter()
    report = train_run(config(), run_dir, quiet=True).report
    print(f"trained {run_dir} in {time.perf_counter() - started:.0f} s: "
          f"test accuracy {report['test']['accuracy']:.3f}")
    return run_dir


def _collect(per_text: dict[str, dict[str, list[float]]], found: dict[str, dict[str, float]]) -> None:
    for name, values in found.items():
        for measure, value in values.items():
            per_text.setdefault(name, {}).setdefault(measure, []).append(value)


def _random_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.random(n)


def evaluate_classifier(model, tokenizer, texts: Sequence[str], *, steps: int, max_length: int, draws: int,
                        seed: int) -> dict[str, Any]:
    """Every measure of every classifier method and the random ranking, text by text."""
    from attnlab.inspect.compute.token_attribution import METHODS, attribute_tokens
    from attnlab.workflows.explain_text import baseline_for
    from attnlab.workflows.inspect_text import encode_text

    pad_id = getattr(getattr(getattr(model, "encoder", None), "config", None), "pad_id", None) or 0
    per_text: dict[str, dict[str, list[float]]] = {}
    seconds, gaps = {name: 0.0 for name in METHODS}, []
    rng = np.random.default_rng(seed)
    for index, text in enumerate(texts):
        input_ids, tokens = encode_text(tokenizer, text, max_length)
        ids = input_ids[0].tolist()
        words = [i for i, token in enumerate(tokens) if token not in SPECIAL]
        if len(words) < 2:
            continue
        rankings = {}
        for name in METHODS:  # one at a time, to time each
            started = time.perf_counter()
            result = attribute_tokens(model, input_ids, [name], steps=steps,
                                      baseline_ids=baseline_for(input_ids, tokenizer, pad_id))
            seconds[name] += time.perf_counter() - started
            rankings[name] = result.scores[name][0].float().numpy()[words]
            label = int(result.target[0])
            if result.delta is not None:
                gaps.append(float(result.delta.abs().mean()))
        rankings["random"] = _random_scores(rng, len(words))
        quantity = Quantity(model, label, decoder=False, pad_id=pad_id, batch=64)
        _collect(per_text, measure_input(quantity, ids, words, rankings, draws=draws,
                                         generator=torch.Generator().manual_seed(seed + index)))
    return _summarise(per_text, seconds, gaps)


def evaluate_decoder(model, tokenizer, texts: Sequence[str], *, steps: int, prompt_tokens: int, draws: int,
                     seed: int) -> dict[str, Any]:
    """The same on a decoder: ``log p(next token)`` of the token it predicts after each prompt."""
    from attnlab.inspect.compute.generation_attribution import GENERATION_METHODS, attribute_generation
    from attnlab.workflows.explain_generation import neutral_token_id

    neutral = neutral_token_id(model)
    per_text: dict[str, dict[str, list[float]]] = {}
    seconds, gaps = {name: 0.0 for name in GENERATION_METHODS}, []
    rng = np.random.default_rng(seed)
    for index, text in enumerate(texts):
        encoding = tokenizer.encode(text)
        ids = encoding.ids[:prompt_tokens]
        special = (getattr(encoding, "special_tokens_mask", None) or [0] * len(encoding.ids))[:prompt_tokens]
        words = [i for i in range(len(ids)) if not special[i]]  # Gemma's <bos> stays
        if len(words) < 2:
            continue
        with torch.no_grad():
            target = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        full = torch.tensor([ids + [target]])
        # integrated gradients' reference: the neutral token at every word, the special tokens kept
        baseline = torch.tensor([[token if special[i] else neutral for i, token in enumerate(ids)]
                                 + [target]])
        rankings = {}
        for name in GENERATION_METHODS:  # one at a time, to time each
            started = time.perf_counter()
            found = attribute_generation(model, full, len(ids), [name], neutral_id=neutral, steps=steps,
                                         baseline_ids=baseline)
            seconds[name] += time.perf_counter() - started
            rankings[name] = found.scores[name][0, : len(ids)].float().numpy()[words]
            if found.delta is not None:
                gaps.append(float(found.delta.abs().mean()))
        rankings["random"] = _random_scores(rng, len(words))
        quantity = Quantity(model, target, decoder=True, pad_id=neutral, batch=16, empty_id=neutral)
        _collect(per_text, measure_input(quantity, ids, words, rankings, draws=draws,
                                         generator=torch.Generator().manual_seed(seed + index)))
    return _summarise(per_text, seconds, gaps)


def _summarise(per_text: dict[str, dict[str, list[float]]], seconds: dict[str, float],
               gaps: list[float]) -> dict[str, Any]:
    counted = len(next(iter(per_text.values()))["deletion_aopc"]) if per_text else 0
    figures = {measure: {name: interval(values[measure]) for name, values in per_text.items()}
               for measure in MEASURES}
    return {"texts": counted, "figures": figures,
            "seconds_per_text": {name: total / max(counted, 1) for name, total in seconds.items()},
            "completeness_gap": float(np.mean(gaps)) if gaps else None}


def as_family(entry: dict[str, Any]) -> FamilyFaithfulness:
    """One model's results read as the package's reader reads them."""
    return FamilyFaithfulness(
        family=entry["family"], kind=entry["kind"], model=entry["model"], quantity=entry["quantity"],
        texts=entry["texts"], figures=entry["figures"], primary=MEASURES[0],
        higher_is_better={measure: ABOUT[measure][0] for measure in MEASURES})


def table(entry: dict[str, Any]) -> str:
    """A Markdown table of one model: methods by deletion AOPC, ``mean [low, high]`` per measure,
    ``*`` where the method does not clear the random ranking."""
    measured = as_family(entry)
    figures = entry["figures"]
    arrows = {measure: "↑" if ABOUT[measure][0] else "↓" for measure in MEASURES}
    header = " | ".join(f"{measure} {arrows[measure]}" for measure in MEASURES)
    lines = [f"| method | {header} | s/text |", "|---" * (len(MEASURES) + 2) + "|"]
    names = sorted(figures[MEASURES[0]], key=lambda name: (name == "random", -figures[MEASURES[0]][name][0]))
    for name in names:
        cells = []
        for measure in MEASURES:
            mean, low, high = figures[measure][name]
            mark = "*" if name != "random" and measured.at_or_below_random(name, measure) else ""
            cells.append(f"{mean:.3f} [{low:.3f}, {high:.3f}]{mark}")
        seconds = entry["seconds_per_text"].get(name)
        timing = "" if seconds is None else f"{seconds:.2f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {timing} |")
    return "\n".join(lines)


def plot(entries: dict[str, Any], path: Path) -> None:
    """Each measure's means and intervals per method, one row of panels per model (Agg canvas)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(16, 3.2 * len(entries)))
    for row, (spec, entry) in enumerate(entries.items()):
        for column, measure in enumerate(MEASURES):
            panel = figure.add_subplot(len(entries), len(MEASURES), row * len(MEASURES) + column + 1)
            rows = entry["figures"][measure]
            names = list(rows)
            means = np.array([rows[name][0] for name in names])
            spread = np.array([[mean - low, high - mean] for mean, low, high in rows.values()]).T  # [2, M]
            colours = ["black" if name == "random" else "tab:blue" for name in names]
            panel.barh(range(len(names)), means, xerr=spread, color=colours, alpha=0.7)
            panel.set_yticks(range(len(names)), names, fontsize=7)
            arrow = "higher" if ABOUT[measure][0] else "lower"
            panel.set_title(f"{entry['model']}: {measure} ({arrow}: more faithful)", fontsize=8)
            panel.grid(alpha=0.3, axis="x")
    figure.savefig(path, dpi=100, bbox_inches="tight")


def record(entries: dict[str, Any], command: str, cpu: str) -> dict[str, Any]:
    """The figures in the format of the package's ``faithfulness.json``."""
    keys = ("family", "kind", "model", "quantity", "texts", "figures")
    return {"command": command, "cpu": cpu, "primary": MEASURES[0],
            "measures": {measure: {"higher_is_better": ABOUT[measure][0], "about": ABOUT[measure][1]}
                         for measure in MEASURES},
            "families": [{key: entry[key] for key in keys} for entry in entries.values()]}


def _model_name(spec: str, run_dir: Optional[Path], accuracy: Optional[float]) -> str:
    if spec == "minilm":
        return f"all-MiniLM-L6-v2 fine-tuned on Rotten Tomatoes (test accuracy {accuracy:.3f})"
    return MODEL_NAMES.get(spec, Path(spec).name or spec) if run_dir is None else run_dir.name


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", default=None,
                        help="a classifier (repeatable): a directory, 'minilm' (MiniLM fine-tuned into "
                             "OUT/minilm-run) or 'demo' (the demo model, trained into OUT/demo-run)")
    parser.add_argument("--decoder", action="append", default=None,
                        help="a decoder (repeatable): smollm2, gemma3-270m, a .gguf file or a directory; "
                             "without --model and --decoder: smollm2, gemma3-270m and --model minilm")
    parser.add_argument("--texts", type=int, default=50, help="the first N texts of the test split")
    parser.add_argument("--steps", type=int, default=20, help="integrated gradients' quadrature points")
    parser.add_argument("--draws", type=int, default=4, help="Bernoulli masks per soft measure and text")
    parser.add_argument("--prompt-tokens", type=int, default=24, help="tokens kept per prompt (decoders)")
    parser.add_argument("--max-length", type=int, default=64, help="tokens kept per text (classifiers)")
    parser.add_argument("--finetune-examples", type=int, default=1600, help="MiniLM's training texts")
    parser.add_argument("--finetune-epochs", type=int, default=2, help="MiniLM's epochs")
    parser.add_argument("--epochs", type=int, default=3, help="the demo model's epochs, if trained here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="the random ranking's and the masks' seed")
    parser.add_argument("--out", type=Path, default=Path("faithfulness"), help="output directory")
    parser.add_argument("--record", type=Path, default=None,
                        help="also write the figures in the package's faithfulness.json format here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 texts, 2 points, 2 draws")
    args = parser.parse_args(argv)
    if args.quick:
        args.texts, args.steps, args.draws, args.prompt_tokens = 3, 2, 2, min(args.prompt_tokens, 8)
    if min(args.texts, args.steps, args.draws, args.prompt_tokens) < 1:
        parser.error("--texts, --steps, --draws and --prompt-tokens must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import attnlab

    args.out.mkdir(parents=True, exist_ok=True)
    cpu = cpu_description()
    print(f"CPU: {cpu}; torch threads {torch.get_num_threads()}", flush=True)
    given = bool(args.model or args.decoder)
    decoders = args.decoder or ([] if given else ["smollm2", "gemma3-270m"])
    classifiers = args.model or ([] if given else ["minilm"])
    texts = [text for text, _ in load_rotten_tomatoes(seed=0)["test"]][: args.texts]
    entries: dict[str, Any] = {}
    arguments = " ".join(shlex.quote(arg) for arg in (sys.argv[1:] if argv is None else argv))
    command = f"python benchmarks/faithfulness.py {arguments}".strip()
    names = ("texts", "steps", "draws", "prompt_tokens", "max_length", "finetune_examples", "finetune_epochs",
             "seed")
    settings = {name: getattr(args, name) for name in names}

    def write() -> None:  # after every model: a run stopped later keeps what it measured
        write_json(args.out / "faithfulness.json", {"command": command, "cpu": cpu, "settings": settings,
                                                    "torch_threads": torch.get_num_threads(),
                                                    "models": entries})
        if args.record:
            write_json(args.record, record(entries, command, cpu))

    def measured(spec: str, kind: str, quantity: str, evaluate: Callable, run_dir: Optional[Path] = None,
                 accuracy: Optional[float] = None) -> None:
        started = time.perf_counter()
        model, tokenizer, _ = attnlab.load(str(run_dir or spec))
        loaded = time.perf_counter() - started
        entry = evaluate(model.eval(), tokenizer)
        seconds = time.perf_counter() - started
        name = _model_name(spec, run_dir, accuracy)
        family = model_family(model) or f"attnlab-{kind}"
        entries[spec] = {"family": family, "kind": kind, "model": name, "quantity": quantity,
                         **entry, "seconds": seconds, "load_seconds": loaded}
        gap = entry["completeness_gap"]
        print(f"\n{name} ({entries[spec]['family']}): {entry['texts']} texts, {seconds:.0f} s "
              f"(loading {loaded:.0f} s); {quantity}"
              + ("" if gap is None else f"; integrated gradients' mean |completeness gap| {gap:.3f}"))
        print(table(entries[spec]), flush=True)
        write()

    for spec in decoders:
        measured(spec, "decoder", "log p(next token), nats",
                 lambda model, tokenizer: evaluate_decoder(model, tokenizer, texts, steps=args.steps,
                                                           draws=args.draws, prompt_tokens=args.prompt_tokens,
                                                           seed=args.seed))
    for spec in classifiers:
        run_dir, accuracy = None, None
        if spec in ("minilm", "demo"):
            run_dir = (finetune_minilm(args.out, args.finetune_examples, args.finetune_epochs)
                       if spec == "minilm" else train_demo_model(args.out, args.epochs))
            accuracy = float(attnlab_report(run_dir)["test"]["accuracy"])
            print(f"{spec}: {run_dir}, test accuracy {accuracy:.3f}")
        measured(spec, "classifier", "probability of the predicted class",
                 lambda model, tokenizer: evaluate_classifier(model, tokenizer, texts, steps=args.steps,
                                                              draws=args.draws, max_length=args.max_length,
                                                              seed=args.seed), run_dir, accuracy)
    plot(entries, args.out / "faithfulness.png")
    print(f"\nwrote {args.out / 'faithfulness.json'} and {args.out / 'faithfulness.png'}"
          + (f"; recorded the figures in {args.record}" if args.record else ""))
    return 0


def attnlab_report(run_dir: Path) -> dict[str, Any]:
    """The test report a training run wrote."""
    from attnlab._files import read_json

    return read_json(run_dir / "test_report.json")


if __name__ == "__main__":
    raise SystemExit(main())
