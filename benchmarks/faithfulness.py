"""How faithful is each attribution method? ERASER comprehensiveness and sufficiency, deletion AOPC.

For every test text, each method (``raw``, ``rollout``, ``flow``, ``grad-attention``,
``relevance``, ``integrated-gradients``) and a random baseline rank the text's tokens
(``[CLS]``/``[SEP]`` stay in place). With ``p`` the model's probability of the class it
predicts on the whole text (DeYoung et al. 2020, "ERASER"):

* comprehensiveness at k %  = ``p(x) - p(x without its top k % tokens)``  (higher: more faithful)
* sufficiency at k %        = ``p(x) - p(only the top k % tokens)``       (lower: more faithful)
* deletion AOPC             = mean over k = 0, 10, ..., 100 % of ``p(x) - p(x without the top k %)``
  (Samek et al. 2017; higher: more faithful)

Tokens are deleted (the sequence gets shorter), not masked, as in ERASER. k % of ``n``
word tokens is ``ceil(k n / 100)`` tokens.

Models: ``--model DIR`` (repeatable; an attnlab run or checkpoint, or a HuggingFace
directory such as a fine-tuned MiniLM run). Without one, a from-scratch model with the
demo's architecture is trained first (``--epochs``, default 3) into ``OUT/demo-run``,
or reused when that run is already there. Texts: the embedded Rotten Tomatoes test split
(``--texts N``, the first N). Writes ``OUT/faithfulness.json``, ``OUT/faithfulness.png``
and prints a table per model::

    python benchmarks/faithfulness.py --texts 100 --steps 20 --out faithfulness/
    python benchmarks/faithfulness.py --model runs/minilm-finetuned --texts 100
    python benchmarks/faithfulness.py --model runs/minilm-finetuned --model demo   # both, one run

Decoders (``--decoder SPEC``, repeatable: ``smollm2``, a ``.gguf`` file, a GPT-2 / Llama-family
directory): each text, cut to its first ``--prompt-tokens`` tokens, is a prompt, and the
explained quantity is the log-probability of the model's own next token (greedy) after
it. Every method of ``attnlab explain --prompt`` (``raw``, ``rollout``, ``grad-attention``,
``integrated-gradients``, ``occlusion``) and a random ranking order the prompt's tokens;
the measures are the same with ``p`` replaced by ``log p(next token)`` (nats), tokens deleted
from the prompt (a prompt left empty is the neutral token alone)::

    python benchmarks/faithfulness.py --decoder smollm2 --texts 30 --steps 20 --out faithfulness-lm/
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from attnlab._files import write_json
from attnlab.data import load_rotten_tomatoes
from attnlab.workflows.explain_text import baseline_for
from attnlab.workflows.inspect_text import encode_text
from attnlab.inspect.compute.token_attribution import METHODS, attribute_tokens

FRACTIONS = (10, 20, 50)  # ERASER's k, in % of the text's tokens
DELETION_STEPS = tuple(range(0, 101, 10))  # the deletion curve, in %
SPECIAL = {"[CLS]", "[SEP]", "<s>", "</s>", "[BOS]", "[EOS]"}


def train_demo_model(out: Path, epochs: int) -> Path:
    """A from-scratch classifier with the demo's architecture (``attnlab train`` defaults)."""
    from attnlab.train.run import train_run
    from attnlab.train.run_config import RunConfig

    run_dir = out / "demo-run"
    if (run_dir / "test_report.json").is_file():
        print(f"reusing {run_dir}")
        return run_dir
    config = RunConfig().with_overrides([f"train.epochs={epochs}"])
    started = time.perf_counter()
    report = train_run(config, run_dir, quiet=True).report
    print(
        f"trained {run_dir} in {time.perf_counter() - started:.0f} s: test accuracy {report['test']['accuracy']:.3f}"
    )
    return run_dir


def _probabilities(
    model, sequences: Sequence[list[int]], pad_id: int, label: int, batch: int = 128
) -> np.ndarray:
    """``p(label)`` for each id sequence (padded per batch, with a mask)."""
    values = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        T = max(len(s) for s in chunk)
        ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.bool)
        for row, sequence in enumerate(chunk):
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = True
        with torch.no_grad():
            logits = model(ids, mask=mask).logits.float()
        values.append(torch.softmax(logits, -1)[:, label].numpy())
    return np.concatenate(values)


def _variants(ids: list[int], words: list[int], order: list[int]) -> list[list[int]]:
    """Comprehensiveness, sufficiency and deletion inputs for one ranking, in that order."""
    n = len(words)
    top = lambda percent: set(order[: math.ceil(percent * n / 100)])  # noqa: E731
    keep_all = set(range(len(ids))) - set(words)  # special tokens stay
    variants = []
    for percent in FRACTIONS:
        variants.append([ids[i] for i in range(len(ids)) if i not in top(percent)])  # without the top k %
    for percent in FRACTIONS:
        kept = top(percent) | keep_all
        variants.append([ids[i] for i in range(len(ids)) if i in kept])  # only the top k %
    for percent in DELETION_STEPS[1:]:
        variants.append([ids[i] for i in range(len(ids)) if i not in top(percent)])
    return variants


def evaluate_model(
    model, tokenizer, texts: Sequence[str], *, steps: int, max_length: int, seed: int
) -> dict[str, Any]:
    """Per-method means over ``texts`` of every measure, and seconds per text."""
    pad_id = getattr(model.encoder.config, "pad_id", None) or 0
    names = list(METHODS) + ["random"]
    sums = {name: np.zeros(2 * len(FRACTIONS) + len(DELETION_STEPS) - 1) for name in names}
    seconds = {name: 0.0 for name in METHODS}
    rng = np.random.default_rng(seed)
    counted = 0
    for text in texts:
        input_ids, tokens = encode_text(tokenizer, text, max_length)
        ids = input_ids[0].tolist()
        words = [i for i, token in enumerate(tokens) if token not in SPECIAL]
        if len(words) < 2:
            continue
        orders = {}
        for name in METHODS:  # one at a time, to time each
            started = time.perf_counter()
            result = attribute_tokens(
                model, input_ids, [name], steps=steps, baseline_ids=baseline_for(input_ids, tokenizer, pad_id)
            )
            seconds[name] += time.perf_counter() - started
            scores = result.scores[name][0].numpy()
            orders[name] = sorted(words, key=lambda i: -scores[i])
            label = int(result.target[0])
        shuffled = list(words)
        rng.shuffle(shuffled)
        orders["random"] = shuffled
        p_full = _probabilities(model, [ids], pad_id, label)[0]
        batch = [variant for name in names for variant in _variants(ids, words, orders[name])]
        probabilities = _probabilities(model, batch, pad_id, label).reshape(len(names), -1)
        for row, name in enumerate(names):
            sums[name] += p_full - probabilities[row]
        counted += 1
    return _summarise(sums, seconds, counted)


def _log_probabilities(model, sequences: Sequence[list[int]], target: int, batch: int = 32) -> np.ndarray:
    """``log p(target)`` after each id sequence (left-padded per batch, with a mask)."""
    values = []
    for start in range(0, len(sequences), batch):
        chunk = sequences[start : start + batch]
        T = max(len(s) for s in chunk)
        ids = torch.zeros((len(chunk), T), dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.long)
        for row, sequence in enumerate(chunk):
            ids[row, T - len(sequence) :] = torch.tensor(sequence)
            mask[row, T - len(sequence) :] = 1
        with torch.no_grad():
            logits = model(ids, mask=mask).logits[:, -1].float()
        values.append(torch.log_softmax(logits, -1)[:, target].numpy())
    return np.concatenate(values)


def evaluate_decoder(
    model, tokenizer, texts: Sequence[str], *, steps: int, prompt_tokens: int, seed: int
) -> dict[str, Any]:
    """The same measures on a decoder: the drop of ``log p(next token)`` when prompt tokens go."""
    from attnlab.workflows.explain_generation import neutral_token_id
    from attnlab.inspect.compute.generation_attribution import GENERATION_METHODS, attribute_generation

    neutral = neutral_token_id(model)
    names = list(GENERATION_METHODS) + ["random"]
    sums = {name: np.zeros(2 * len(FRACTIONS) + len(DELETION_STEPS) - 1) for name in names}
    seconds = {name: 0.0 for name in GENERATION_METHODS}
    rng = np.random.default_rng(seed)
    counted = 0
    for text in texts:
        ids = tokenizer.encode(text).ids[:prompt_tokens]
        if len(ids) < 2:
            continue
        with torch.no_grad():
            target = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        full = torch.tensor([ids + [target]])
        words = list(range(len(ids)))
        orders = {}
        for name in GENERATION_METHODS:  # one at a time, to time each
            started = time.perf_counter()
            found = attribute_generation(model, full, len(ids), [name], neutral_id=neutral, steps=steps)
            seconds[name] += time.perf_counter() - started
            scores = found.scores[name][0, : len(ids)].numpy()
            orders[name] = sorted(words, key=lambda i: -scores[i])
        shuffled = list(words)
        rng.shuffle(shuffled)
        orders["random"] = shuffled
        base = _log_probabilities(model, [ids], target)[0]
        batch = [variant or [neutral] for name in names for variant in _variants(ids, words, orders[name])]
        values = _log_probabilities(model, batch, target).reshape(len(names), -1)
        for row, name in enumerate(names):
            sums[name] += base - values[row]
        counted += 1
    return _summarise(sums, seconds, counted)


def _summarise(sums: dict[str, np.ndarray], seconds: dict[str, float], counted: int) -> dict[str, Any]:
    results = {}
    for name, total in sums.items():
        means = total / max(counted, 1)
        k = len(FRACTIONS)
        deletion = np.concatenate([[0.0], means[2 * k :]])  # k = 0 % removes nothing
        results[name] = {
            **{f"comprehensiveness_{p}": float(means[i]) for i, p in enumerate(FRACTIONS)},
            **{f"sufficiency_{p}": float(means[k + i]) for i, p in enumerate(FRACTIONS)},
            "comprehensiveness_mean": float(means[:k].mean()),
            "sufficiency_mean": float(means[k : 2 * k].mean()),
            "deletion_aopc": float(deletion.mean()),
            "deletion_curve": deletion.tolist(),
            "seconds_per_text": seconds[name] / max(counted, 1) if name in seconds else 0.0,
        }
    return {"texts": counted, "methods": results}


def table(results: dict[str, Any]) -> str:
    """A Markdown table of one model's results, methods ranked by deletion AOPC."""
    header = (
        "| method | "
        + " | ".join(f"comp {p}%" for p in FRACTIONS)
        + " | comp mean | "
        + " | ".join(f"suff {p}%" for p in FRACTIONS)
        + " | suff mean | deletion AOPC | s/text |"
    )
    lines = [header, "|" + "---|" * (2 * len(FRACTIONS) + 5)]
    ranked = sorted(results["methods"].items(), key=lambda item: -item[1]["deletion_aopc"])
    for name, values in ranked:
        cells = [f"{values[f'comprehensiveness_{p}']:.3f}" for p in FRACTIONS] + [
            f"{values['comprehensiveness_mean']:.3f}"
        ]
        cells += [f"{values[f'sufficiency_{p}']:.3f}" for p in FRACTIONS] + [
            f"{values['sufficiency_mean']:.3f}"
        ]
        cells += [f"{values['deletion_aopc']:.3f}", f"{values['seconds_per_text']:.3f}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(all_results: dict[str, Any], path: Path) -> None:
    """Comprehensiveness, sufficiency and deletion curves per model (Agg canvas, no pyplot)."""
    from matplotlib.figure import Figure

    models = list(all_results)
    figure = Figure(figsize=(15, 4.2 * len(models)))
    for row, model in enumerate(models):
        methods = all_results[model]["methods"]
        panels = [figure.add_subplot(len(models), 3, 3 * row + i + 1) for i in range(3)]
        for name, values in methods.items():
            style = {"linestyle": "--", "color": "black"} if name == "random" else {}
            panels[0].plot(
                FRACTIONS,
                [values[f"comprehensiveness_{p}"] for p in FRACTIONS],
                marker="o",
                label=name,
                **style,
            )
            panels[1].plot(
                FRACTIONS, [values[f"sufficiency_{p}"] for p in FRACTIONS], marker="o", label=name, **style
            )
            panels[2].plot(
                DELETION_STEPS,
                values["deletion_curve"],
                label=f"{name} ({values['deletion_aopc']:.3f})",
                **style,
            )
        titles = (
            "comprehensiveness (higher: more faithful)",
            "sufficiency (lower: more faithful)",
            "deletion: p(x) - p(x without top k %) (AOPC)",
        )
        for panel, title in zip(panels, titles):
            panel.set_title(f"{Path(model).name}: {title}", fontsize=9)
            panel.set_xlabel("% of tokens")
            panel.grid(alpha=0.3)
        panels[2].legend(fontsize=7)
    figure.savefig(path, dpi=110, bbox_inches="tight")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="model directory (repeatable); 'demo': the demo model, trained here when OUT/demo-run "
        "is not there yet (the default)",
    )
    parser.add_argument(
        "--decoder",
        action="append",
        default=None,
        help="a decoder (repeatable): smollm2, a .gguf file or a GPT-2 / Llama-family directory; "
        "measures next-token log-probability (without --model, only decoders run)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=24, help="tokens kept per prompt (decoders)")
    parser.add_argument("--texts", type=int, default=100, help="the first N texts of the test split")
    parser.add_argument("--steps", type=int, default=20, help="integrated gradients' quadrature points")
    parser.add_argument("--max-length", type=int, default=64, help="tokens kept per text")
    parser.add_argument(
        "--epochs", type=int, default=3, help="epochs of the demo model, when it is trained here"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="the random baseline's seed")
    parser.add_argument("--out", type=Path, default=Path("faithfulness"), help="output directory")
    args = parser.parse_args(argv)
    if args.texts < 1 or args.steps < 1:
        parser.error("--texts and --steps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import attnlab

    args.out.mkdir(parents=True, exist_ok=True)
    specs = args.model or ([] if args.decoder else ["demo"])
    models = [str(train_demo_model(args.out, args.epochs)) if spec == "demo" else spec for spec in specs]
    texts = [text for text, _ in load_rotten_tomatoes(seed=0)["test"]][: args.texts]
    all_results = {}
    for spec in args.decoder or []:
        model, tokenizer, _ = attnlab.load(spec)
        started = time.perf_counter()
        all_results[spec] = evaluate_decoder(
            model.eval(), tokenizer, texts, steps=args.steps, prompt_tokens=args.prompt_tokens, seed=args.seed
        )
        all_results[spec]["measure"] = "log p(next token), nats"
        print(f"\n{spec}: {all_results[spec]['texts']} prompts, {time.perf_counter() - started:.0f} s "
              f"(drop of log p(next token) in nats)")
        print(table(all_results[spec]))
    for spec in models:
        model, tokenizer, _ = attnlab.load(spec)
        started = time.perf_counter()
        all_results[spec] = evaluate_model(
            model.eval(), tokenizer, texts, steps=args.steps, max_length=args.max_length, seed=args.seed
        )
        print(f"\n{spec}: {all_results[spec]['texts']} texts, {time.perf_counter() - started:.0f} s")
        print(table(all_results[spec]))
    settings = {
        "texts": args.texts,
        "steps": args.steps,
        "max_length": args.max_length,
        "prompt_tokens": args.prompt_tokens,
        "fractions": list(FRACTIONS),
        "deletion_steps": list(DELETION_STEPS),
        "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
    }
    write_json(args.out / "faithfulness.json", {"settings": settings, "models": all_results})
    plot(all_results, args.out / "faithfulness.png")
    print(f"\nwrote {args.out / 'faithfulness.json'} and {args.out / 'faithfulness.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
