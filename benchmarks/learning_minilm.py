"""Fine-tune MiniLM on the embedded Rotten Tomatoes split through ``attnlab.train``.

The ``minilm-finetuned`` section of ``benchmarks/learning.py`` calls
:func:`finetune_with_trainer`; run that for the accuracy next to the TF-IDF +
logistic-regression baseline in one run::

    python benchmarks/learning.py --only tfidf-logreg minilm-finetuned

Alone, with hyper-parameters changed (one heavy job at a time on a shared machine)::

    python benchmarks/learning_minilm.py --set epochs=2 --set learning_rate=5e-5
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from attnlab.data import load_rotten_tomatoes

# A starting point for fine-tuning on two CPU cores, not the result of a search.
HYPERPARAMETERS: dict[str, Any] = {
    "learning_rate": 1e-4,
    "epochs": 1,
    "batch_size": 32,
    "max_length": 64,
    "warmup_fraction": 0.1,
    "weight_decay": 0.01,
    "dropout": 0.1,
    "seed": 0,
}


def finetune_with_trainer(
    settings: dict[str, Any], out_dir: Path, extra_overrides: Sequence[str] = ()
) -> dict[str, float]:
    """Fine-tune through ``attnlab.train`` (``model.pretrained = "minilm"``).

    ``extra_overrides`` are further ``section.key=value`` settings of the run. Returns
    ``test_accuracy`` and ``train_seconds``.
    """
    from attnlab.train.run import train_run
    from attnlab.train.run_config import RunConfig

    train_size = load_rotten_tomatoes(seed=settings["seed"]).sizes()["train"]
    steps = settings["epochs"] * math.ceil(train_size / settings["batch_size"])
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


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the run directory here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help=f"change a hyper-parameter, one of {sorted(HYPERPARAMETERS)}")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = dict(HYPERPARAMETERS)
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in HYPERPARAMETERS:
            parser.error(f"--set {item}: unknown hyper-parameter {name!r}; known: {sorted(HYPERPARAMETERS)}")
        settings[name] = type(HYPERPARAMETERS[name])(json.loads(value))
    print(f"fine-tuning MiniLM with {settings}")
    with tempfile.TemporaryDirectory() as scratch:
        result = finetune_with_trainer(settings, (args.out or Path(scratch)) / "minilm")
    print(f"MiniLM fine-tuned: test accuracy {result['test_accuracy']:.4f}, "
          f"training {result['train_seconds']:.0f} s")


if __name__ == "__main__":
    main()
