"""Does it learn? Test accuracy on the embedded Rotten Tomatoes split, side by side.

    python benchmarks/learning.py [--only NAME ...] [--set KEY=VALUE ...]

Every section trains on the same fixed train split, selects on the validation split
only, and reports accuracy on the test split. Sections are registered with
``@section("name")``; add yours below the existing ones. A section receives the shared
:class:`Context` and returns a dict with at least ``test_accuracy``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from attnlab.data import DatasetSplits, load_rotten_tomatoes


@dataclass
class Context:
    splits: DatasetSplits
    out: Path  # a scratch directory for this benchmark run
    overrides: list[str] = field(default_factory=list)  # --set, for the default-config section
    quiet: bool = True


@dataclass
class Section:
    name: str
    run: Callable[[Context], dict]


SECTIONS: list[Section] = []


def section(name: str) -> Callable[[Callable[[Context], dict]], Callable[[Context], dict]]:
    def register(function: Callable[[Context], dict]) -> Callable[[Context], dict]:
        SECTIONS.append(Section(name, function))
        return function
    return register


def _tfidf_logistic_regression(context: Context, *, ngram_range: tuple[int, int], sublinear_tf: bool,
                               C_values: tuple[float, ...]) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    texts = {name: [text for text, _ in context.splits[name]] for name in ("train", "validation", "test")}
    labels = {name: [label for _, label in context.splits[name]] for name in ("train", "validation", "test")}
    vectorizer = TfidfVectorizer(ngram_range=ngram_range, sublinear_tf=sublinear_tf)
    features = {"train": vectorizer.fit_transform(texts["train"])}
    features.update({name: vectorizer.transform(texts[name]) for name in ("validation", "test")})
    best = None
    for C in C_values:  # chosen on the validation split, never on test
        model = LogisticRegression(C=C, max_iter=2000).fit(features["train"], labels["train"])
        score = model.score(features["validation"], labels["validation"])
        if best is None or score > best[0]:
            best = (score, C, model)
    validation, C, model = best
    return {"test_accuracy": model.score(features["test"], labels["test"]), "validation_accuracy": validation,
            "note": f"word {ngram_range[0]}-{ngram_range[1]}-grams, C={C}"}


@section("tfidf-logreg")
def tfidf_logistic_regression(context: Context) -> dict:
    """The baseline: scikit-learn's TfidfVectorizer + LogisticRegression with their defaults."""
    return _tfidf_logistic_regression(context, ngram_range=(1, 1), sublinear_tf=False, C_values=(1.0,))


@section("tfidf-logreg-tuned")
def tfidf_logistic_regression_tuned(context: Context) -> dict:
    """A stronger reference: uni+bigrams, sublinear tf, C chosen on validation."""
    return _tfidf_logistic_regression(context, ngram_range=(1, 2), sublinear_tf=True,
                                      C_values=(0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0))


@section("encoder-from-scratch")
def encoder_from_scratch(context: Context) -> dict:
    """The default `attnlab train` config: the demo run."""
    from attnlab.train.run import train_run
    from attnlab.train.run_config import RunConfig

    config = RunConfig().with_overrides(context.overrides)
    result = train_run(config, context.out / "encoder-from-scratch", quiet=context.quiet)
    report = result.report
    return {"test_accuracy": report["test"]["accuracy"], "test_f1": report["test"]["f1"],
            "validation_accuracy": report["best_validation_accuracy"] if "best_validation_accuracy" in report else None,
            "note": f"{config.model.num_layers} layers, d_model {config.model.d_model}, "
                    f"{report['steps']} steps, best at step {report['best_step']}"}



@section("minilm-finetuned")
def minilm_finetuned(context: Context) -> dict:
    """The pretrained MiniLM fine-tuned on the same split with attnlab's default recipe
    (``attnlab train --set model.pretrained=minilm``)."""
    from learning_minilm import HYPERPARAMETERS, finetune_with_trainer

    from attnlab.train.run_config import fine_tuning_defaults

    result = finetune_with_trainer(dict(HYPERPARAMETERS), context.out / "minilm-finetuned")
    recipe = dict(item.split("=", 1) for item in fine_tuning_defaults("minilm"))  # later entries win
    return {"test_accuracy": result["test_accuracy"],
            "note": f"train {result['train_seconds']:.0f} s, the default recipe: "
                    + ", ".join(f"{key}={value}" for key, value in recipe.items())}


@section("digits-text")
def digits_text(context: Context) -> dict:
    """Not Rotten Tomatoes: the image-text digits task, cross-modal attention vs a concat baseline."""
    from learning_digits import digits_section

    results = digits_section(context.out / "digits-text", quiet=context.quiet)
    return {"test_accuracy": results["cross_attention"]["test_accuracy"],
            "note": f"digits-text held-out images; concat baseline {results['concat']['test_accuracy']:.4f}"}

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=[item.name for item in SECTIONS], help="run these sections")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override the default config in the encoder section")
    parser.add_argument("--out", type=Path, default=None, help="keep runs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--progress", action="store_true", help="show progress bars")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="attnlab-learning-"))
    context = Context(load_rotten_tomatoes(), out, args.overrides, quiet=not args.progress)
    sizes = context.splits.sizes()
    print(f"Rotten Tomatoes: {sizes['train']} train / {sizes['validation']} validation / {sizes['test']} test "
          f"snippets; majority class {max(sum(l for _, l in context.splits.test), sizes['test'] - sum(l for _, l in context.splits.test)) / sizes['test']:.4f} of test")
    results = {}
    for item in SECTIONS:
        if args.only and item.name not in args.only:
            continue
        start = time.perf_counter()
        results[item.name] = {**item.run(context), "seconds": round(time.perf_counter() - start, 1)}
        print(f"{item.name:<24} test accuracy {results[item.name]['test_accuracy']:.4f}  "
              f"({results[item.name]['seconds']:.0f} s; {results[item.name].get('note', '')})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
