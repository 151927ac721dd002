"""``attnlab train``: train a classifier from a TOML config, overrides and a data file."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .._files import nonempty_path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML file with [model], [data] and [train] tables")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one setting, e.g. --set train.epochs=2 or --set task=digits-text (repeatable)")
    parser.add_argument("--data", help="a CSV or JSONL file with text and label columns (default: the embedded "
                                       "Rotten Tomatoes snippets)")
    parser.add_argument("--out", type=nonempty_path, default=Path("runs/default"), help="the run directory (default: %(default)s)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the run in --out (only files attnlab wrote are removed)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no per-evaluation lines")
    parser.add_argument("--device", default=None, help="e.g. cpu or cuda (default: cpu, or this process's GPU)")


def run(args: argparse.Namespace) -> int:
    import torch

    from ..train.distributed import init_distributed, shutdown_distributed
    from ..train.run import train_run
    from ..train.run_checks import check_device
    from ..train.run_config import resolve_run_config
    from ..train.run_dir import check_out_dir

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    if args.resume and (args.config or args.overrides or args.data):
        raise ValueError("--resume continues a run with its saved config.json; drop --config/--set/--data")
    overrides = list(args.overrides) + ([f"data.path={_toml_string(args.data)}"] if args.data else [])
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite replaces it: pass one of them")
    config = resolve_run_config(args.config, overrides)
    check_device(args.device)
    info = init_distributed()
    if info.is_main:
        notice = check_out_dir(args.out, resume=args.resume, overwrite=args.overwrite)
        if notice:
            print(notice, file=sys.stderr)
    if not info.is_main:
        logging.getLogger().setLevel(logging.ERROR)  # one process speaks
    device = args.device
    if device is None and torch.cuda.is_available() and info.world_size > 1:
        device = f"cuda:{info.local_rank}"
    try:
        result = train_run(config, args.out, resume=args.resume, quiet=args.quiet, device=device)
    except BaseException:
        shutdown_distributed(wait_for_others=False)
        raise
    shutdown_distributed()
    if info.is_main:
        test = result.report["test"]
        print(f"test accuracy {test['accuracy']:.4f}  f1 {test['f1']:.4f}  loss {test['loss']:.4f} "
              f"(best validation step {result.report['best_step']})")
        print(f"run directory: {result.run_dir}  (config.json, metrics.jsonl, checkpoints/, test_report.json)")
    return 0


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
