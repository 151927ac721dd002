"""Fine-tune MiniLM on the embedded Rotten Tomatoes split through ``attnlab.train``.

The ``minilm-finetuned`` section of ``benchmarks/learning.py`` calls
:func:`finetune_with_trainer`; run that for the accuracy next to the TF-IDF +
logistic-regression baseline in one run::

    python benchmarks/learning.py --only tfidf-logreg minilm-finetuned

Alone, with hyper-parameters changed (one heavy job at a time on a shared machine)::

    python benchmarks/learning_minilm.py --set epochs=4 --set learning_rate=3e-5
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch


# None: the value of attnlab's own fine-tuning recipe (what `attnlab train --set
# model.pretrained=minilm` uses: attnlab.train.run_config.fine_tuning_defaults).
HYPERPARAMETERS: dict[str, Any] = {
    "learning_rate": None,
    "epochs": None,
    "batch_size": None,
    "max_length": None,
    "warmup_steps": None,
    "weight_decay": None,
    "dropout": None,
    "seed": 0,
}
_SETTING = {
    "learning_rate": "train.learning_rate", "epochs": "train.epochs", "batch_size": "train.batch_size",
    "max_length": "data.max_length", "warmup_steps": "train.warmup_steps", "weight_decay": "train.weight_decay",
    "dropout": "model.classifier_dropout", "seed": "train.seed",
}


def finetune_with_trainer(
    settings: dict[str, Any], out_dir: Path, extra_overrides: Sequence[str] = ()
) -> dict[str, float]:
    """Fine-tune through ``attnlab.train`` (``model.pretrained = "minilm"``): the default
    recipe, with the settings that are not ``None`` on top.

    ``extra_overrides`` are further ``section.key=value`` settings of the run. Returns
    ``test_accuracy`` and ``train_seconds``.
    """
    from attnlab.train.run import train_run
    from attnlab.train.run_config import resolve_run_config

    overrides = ['model.pretrained="minilm"']
    overrides += [f"{_SETTING[name]}={value}" for name, value in settings.items() if value is not None]
    config = resolve_run_config(None, [*overrides, *extra_overrides])
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
        settings[name] = json.loads(value)
    print(f"fine-tuning MiniLM with {settings}")
    with tempfile.TemporaryDirectory() as scratch:
        result = finetune_with_trainer(settings, (args.out or Path(scratch)) / "minilm")
    print(f"MiniLM fine-tuned: test accuracy {result['test_accuracy']:.4f}, "
          f"training {result['train_seconds']:.0f} s")


if __name__ == "__main__":
    main()
