"""Held-out accuracy on the digits–statements task: cross-modal attention vs a baseline.

    python benchmarks/learning_digits.py [--set KEY=VALUE ...]

Both models are trained by ``attnlab train --set task=digits-text`` (the trainer, its
defaults for this task, the same seed, data, schedule and number of steps). The
baseline (``fusion=concat``) has the same image and text encoders and head, and sees
the same inputs, but fuses by concatenating the mean of the patch states with the
text's [CLS] state instead of cross-attention. The test images are never seen in
training. ``benchmarks/learning.py`` calls :func:`digits_section`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

FUSIONS = {"cross_attention": "cross-modal attention", "concat": "concat baseline"}


def digits_section(out: Optional[Path] = None, overrides: Sequence[str] = (), *, quiet: bool = True) -> dict:
    """Train both fusions on the digits task; print and return their held-out accuracy.

    Args:
        out: where the two run directories go (default: a temporary directory).
        overrides: ``KEY=VALUE`` settings applied to both runs (e.g. ``train.epochs=6``).
        quiet: no progress bars.

    Returns:
        ``{"cross_attention": {...}, "concat": {...}}`` with ``test_accuracy``,
        ``validation_accuracy``, ``train_seconds``, ``steps`` and the run directory.
    """
    import torch

    from attnlab.train.run import train_run
    from attnlab.train.run_config import resolve_run_config

    out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="attnlab-digits-"))
    results = {}
    for fusion in FUSIONS:
        config = resolve_run_config(None, ["task=digits-text", *overrides, f"image.fusion={json.dumps(fusion)}"])
        report = train_run(config, out / fusion, quiet=quiet).report
        results[fusion] = {
            "test_accuracy": report["test"]["accuracy"],
            "validation_accuracy": report["best_validation_accuracy"],
            "train_seconds": report["train_seconds"],
            "steps": report["steps"],
            "run_dir": str(out / fusion),
        }
    threads = torch.get_num_threads()
    sizes = report["sizes"]["test"]
    print(f"digits-text, {sizes['images']} held-out images x {sizes['statements'] // sizes['images']} statements "
          f"(true/false balanced); {results['cross_attention']['steps']} steps each, {threads} threads")
    for fusion, name in FUSIONS.items():
        result = results[fusion]
        print(f"  {name:<22} test accuracy {result['test_accuracy']:.4f}  "
              f"(validation {result['validation_accuracy']:.4f}; training {result['train_seconds']:.0f} s)")
    return results


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting of both runs, e.g. --set train.epochs=6")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--progress", action="store_true", help="show progress bars")
    args = parser.parse_args(argv)
    results = digits_section(args.out, args.overrides, quiet=not args.progress)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
