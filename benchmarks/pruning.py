"""Michel et al.'s pruning curve: accuracy against the share of heads removed, and the speed-up.

Heads are ranked by importance (Michel, Levy & Neubig 2019: ``|d loss / d head mask|``
on the validation split, normalised per layer) or at random, and the lowest-ranked
``k %`` of all heads are removed for good with :func:`attnlab.prune_heads` (0 to 80 %,
every layer keeps at least one head). At each point: test accuracy and inference time
over the test texts as a speed-up over the full model, the two timed in turn pass by pass
(median of ``--repeats`` passes each, after a warm-up pass).

Models: ``--model DIR`` (an attnlab run or checkpoint, e.g. a fine-tuned MiniLM run);
without it the demo model of ``benchmarks/faithfulness.py`` is trained (or reused) in
``OUT/demo-run``. Writes ``OUT/pruning.json`` and ``OUT/pruning.png``::

    python benchmarks/pruning.py --out pruning/
    python benchmarks/pruning.py --model runs/minilm-finetuned --texts 500 --out pruning/
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from attnlab._files import write_json
from attnlab.data import load_rotten_tomatoes
from attnlab.data.padding import pad_id_for
from attnlab.data.text_batches import encode_batches
from attnlab.inspect import head_importance
from attnlab.models.pruning import prune_heads

FRACTIONS = tuple(range(0, 81, 10))  # % of all heads removed


def _batches(rows, tokenizer, model, max_length: int) -> list[dict[str, torch.Tensor]]:
    return list(
        encode_batches(
            rows, tokenizer, batch_size=64, max_length=max_length, pad_id=pad_id_for(tokenizer, model)
        )
    )


def _accuracy(model, batches) -> float:
    correct = total = 0
    with torch.no_grad():
        for batch in batches:
            logits = model(batch["input_ids"], mask=batch["mask"]).logits
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
    return correct / total


def _interleaved_seconds(models: list, batches, repeats: int) -> list[float]:
    """Median seconds of a pass over ``batches`` for each model, the models taking turns
    pass by pass after one warm-up pass each, so that machine noise hits them alike."""
    times: list[list[float]] = [[] for _ in models]
    with torch.no_grad():
        for repeat in range(repeats + 1):
            for index, model in enumerate(models):
                started = time.perf_counter()
                for batch in batches:
                    model(batch["input_ids"], mask=batch["mask"])
                if repeat:  # the first pass is the warm-up
                    times[index].append(time.perf_counter() - started)
    return [statistics.median(values) for values in times]


def choose_heads(scores: np.ndarray, count: int) -> dict[str, list[int]]:
    """The ``count`` lowest-scored heads, skipping any that would leave a layer without heads."""
    L, H = scores.shape
    left = [H] * L
    chosen: dict[str, list[int]] = {}
    for flat in np.argsort(scores, axis=None, kind="stable"):
        if sum(len(heads) for heads in chosen.values()) == count:
            break
        layer, head = divmod(int(flat), H)
        if left[layer] > 1:
            chosen.setdefault(f"layer_{layer + 1}", []).append(head)
            left[layer] -= 1
    return chosen


def run(model, tokenizer, *, texts: int, max_length: int, repeats: int, seed: int) -> dict[str, Any]:
    splits = load_rotten_tomatoes(seed=0)
    validation = _batches(splits["validation"][:texts], tokenizer, model, max_length)
    test = _batches(splits["test"][:texts], tokenizer, model, max_length)
    importance = head_importance(model, validation, normalize=True).numpy()  # [L, H]
    rng = np.random.default_rng(seed)
    rankings = {"importance": importance, "random": rng.random(importance.shape)}
    full_accuracy = _accuracy(model, test)
    total = importance.size
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in rankings}
    for name, scores in rankings.items():
        for percent in FRACTIONS:
            count = round(percent * total / 100)
            pruned = copy.deepcopy(model)
            removed = choose_heads(scores, count)
            if removed:
                prune_heads(pruned, removed)
            accuracy = _accuracy(pruned.eval(), test)
            full_seconds, seconds = _interleaved_seconds([model, pruned], test, repeats)
            results[name].append(
                {
                    "percent": percent,
                    "heads_removed": sum(len(h) for h in removed.values()),
                    "accuracy": accuracy,
                    "seconds": seconds,
                    "full_seconds": full_seconds,
                    "speedup": full_seconds / seconds,
                    "removed": removed,
                }
            )
            print(
                f"{name:>10} {percent:3d} %: {results[name][-1]['heads_removed']:3d} heads removed, "
                f"accuracy {accuracy:.3f}, speed-up {full_seconds / seconds:.2f}x"
            )
    return {
        "heads": total,
        "full_accuracy": full_accuracy,
        "importance": importance.tolist(),
        "curves": results,
    }


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4))
    accuracy, speed = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    for name, points in result["curves"].items():
        xs = [point["percent"] for point in points]
        accuracy.plot(xs, [point["accuracy"] for point in points], marker="o", label=f"by {name}")
        speed.plot(xs, [point["speedup"] for point in points], marker="o", label=f"by {name}")
    accuracy.set(xlabel="% of heads removed", ylabel="test accuracy", title=f"{title}: accuracy")
    speed.set(xlabel="% of heads removed", ylabel="speed-up over the full model", title=f"{title}: inference")
    for axes in (accuracy, speed):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.savefig(path, dpi=110, bbox_inches="tight")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="model directory; default: the demo model")
    parser.add_argument("--texts", type=int, default=1281, help="validation and test texts used (first N)")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per point (median)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the demo model, when trained here")
    parser.add_argument("--seed", type=int, default=0, help="the random ranking's seed")
    parser.add_argument("--out", type=Path, default=Path("pruning"))
    args = parser.parse_args(argv)
    import attnlab

    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.model
    if spec is None:
        location = Path(__file__).with_name("faithfulness.py")
        loader = importlib.util.spec_from_file_location("faithfulness_benchmark", location)
        faithfulness = importlib.util.module_from_spec(loader)
        loader.loader.exec_module(faithfulness)
        spec = str(faithfulness.train_demo_model(args.out, args.epochs))
    model, tokenizer, _ = attnlab.load(spec)
    result = run(
        model.eval(),
        tokenizer,
        texts=args.texts,
        max_length=args.max_length,
        repeats=args.repeats,
        seed=args.seed,
    )
    result["settings"] = {
        "model": spec,
        "texts": args.texts,
        "max_length": args.max_length,
        "repeats": args.repeats,
        "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
    }
    write_json(args.out / "pruning.json", result)
    plot(result, args.out / "pruning.png", Path(spec).name)
    print(
        f"full model: accuracy {result['full_accuracy']:.3f}; wrote {args.out / 'pruning.json'} and "
        f"{args.out / 'pruning.png'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
