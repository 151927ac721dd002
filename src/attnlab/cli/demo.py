"""Demonstration job: train the default encoder on the embedded Rotten Tomatoes snippets.

Trains from scratch (tokenizer, encoder, classifier) with the default run config, reports
test accuracy, shows a few predictions, writes one attention map and ends with the
interactive attention report (``inspect/report.html``), all in the run directory. A few
minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ._errors import run_reporting_errors
from .._files import nonempty_path

DEFAULT_OUT = Path("runs/demo")
EXAMPLES = (
    "A warm, funny and beautifully acted film.",
    "Dull, predictable and far too long.",
    "The plot is thin, but the performances make it worth seeing.",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=nonempty_path, default=DEFAULT_OUT,
                        help="run directory; an earlier demo run there is replaced, anything else is refused "
                             "(default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a train run in --out too (only files attnlab wrote are removed)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting of the default config, e.g. --set train.epochs=1")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")


def _show_predictions(run_dir: Path) -> None:
    import torch

    from ..data import encode_texts
    from ..checkpoints import load_model
    from ..train.visualize import attention_map, map_title, save_attention_map

    model, tokenizer, config = load_model(run_dir)
    labels = config["head"]["label_names"]
    ids = encode_texts(tokenizer, list(EXAMPLES), max_length=64)
    with torch.no_grad():
        for text, row in zip(EXAMPLES, ids):
            probabilities = model(torch.tensor([row])).logits.softmax(-1)[0]
            best = int(probabilities.argmax())
            print(f"  {labels[best]:>6} {float(probabilities[best]):.2f}  {text}")
    row = torch.tensor([ids[0]])
    attn = attention_map(model, row, layer_idx=0, head_idx=0)
    tokens = [tokenizer.id_to_token(index) for index in ids[0]][: attn.shape[0]]
    path = save_attention_map(attn, run_dir / "attention.png", title=map_title(0, 0, EXAMPLES[0][:40]),
                              tokens=tokens)
    print(f"attention map of the first example: {path}")


def run(args: argparse.Namespace) -> int:
    import logging

    from ..train.run import train_run
    from ..train.run_checks import check_run
    from ..train.run_config import RunConfig
    from ..train.run_dir import DEMO_MARK, check_out_dir

    # the trainer's plain progress lines (a log file, a job scheduler: no terminal for a bar)
    # go through logging, as in `attnlab train`
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    config = RunConfig().with_overrides([f"train.seed={args.seed}", *args.overrides])
    check_run(config, None)
    notice = check_out_dir(args.out, overwrite=args.overwrite, demo=True, command="demo")
    if notice:
        print(notice)
    args.out.mkdir(parents=True, exist_ok=True)
    mark = "written by attnlab demo: a later demo run may replace this directory\n"
    (args.out / DEMO_MARK).write_text(mark, encoding="utf-8")
    print(f"training a {config.model.num_layers}-layer encoder (d_model {config.model.d_model}) from scratch on "
          f"the Rotten Tomatoes snippets for {config.train.epochs} epochs...", flush=True)
    start = time.perf_counter()
    result = train_run(config, args.out, quiet=args.quiet)
    minutes, seconds = divmod(time.perf_counter() - start, 60)
    test = result.report["test"]
    print(f"done in {int(minutes)} min {seconds:.0f} s: test accuracy {test['accuracy']:.4f}, "
          f"macro-F1 {test['f1']:.4f} ({result.report['sizes']['test']} snippets never used for training "
          f"or model selection)")
    print("predictions of the best checkpoint:")
    _show_predictions(args.out)
    print(f"results in {args.out}/: test_report.json, metrics.jsonl, config.json, tokenizer.json, "
          f"checkpoints/best/, checkpoints/last/")
    print(f"load it with: attnlab.load({str(args.out)!r})")
    report = _write_report(args.out)
    print(f"explore the model live (type a text, click heads, switch them off, see the prediction move): "
          f"attnlab serve --model {shlex.quote(str(args.out))}")
    print(f"attention report of the first example (open it in a browser): {report}")
    return 0


def _write_report(run_dir: Path) -> Path:
    """Pictures and the interactive attention report of the first example, in ``run_dir/inspect``."""
    from ..workflows.inspect_text import write_inspection
    from ..checkpoints import load_model

    model, tokenizer, _ = load_model(run_dir)
    inspection = write_inspection(model, tokenizer, EXAMPLES[0], run_dir / "inspect", formats=("png",),
                                  model_name=str(run_dir))
    return inspection.report


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.cli.demo", description=__doc__)
    add_arguments(parser)
    return run_reporting_errors("demo", run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
