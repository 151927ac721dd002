"""A tiny, seeded training run used by the resume and multi-process tests.

    python tiny_run.py --out DIR [--resume] [--sleep S] [--batch-size N] [--dropout P] [--eval-every N] [--linger S]

Writes DIR/metrics.jsonl (loss of every step) and checkpoints; with --losses, also
DIR/losses.json from process 0 (step -> loss) and DIR/params.pt (final weights).
Stopped by SIGINT or SIGTERM, it prints the one line a command would and exits with
the trainer's status (130, 143).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from attnlab.data import PaddingCollator, TokenizedDataset
from attnlab.models import TransformerEncoder
from attnlab.models import EncoderClassifier
from attnlab.train import TrainingInterrupted, TransformerTrainer
from attnlab.train.distributed import distributed_info, init_distributed, shutdown_distributed


def tiny_dataset(n: int = 48, vocab: int = 30, seed: int = 0) -> TokenizedDataset:
    generator = torch.Generator().manual_seed(seed)
    ids, labels = [], []
    for _ in range(n):
        length = int(torch.randint(3, 12, (1,), generator=generator))
        row = torch.randint(3, vocab, (length,), generator=generator).tolist()
        ids.append([1] + row + [2])
        labels.append(int(sum(row) % 2))
    return TokenizedDataset(ids, labels)


def tiny_model(dropout: float, seed: int = 0) -> EncoderClassifier:
    torch.manual_seed(seed)
    encoder = TransformerEncoder(30, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=dropout, pad_id=0)
    return EncoderClassifier(encoder, 2, dropout=dropout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--losses", action="store_true")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--save-every", type=int, default=2)
    parser.add_argument("--linger", type=float, default=0.0,
                        help="process 0 waits this long before leaving; every process records when it left "
                        "and how many DistributedDataParallel wrappers were still alive")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.linger:
        gc.disable()  # the worst case: no automatic collection before the process exits
    init_distributed()
    code = train(args)  # the trainer is garbage from here on, as in the train command
    rank = distributed_info().rank
    if args.linger and rank == 0:
        time.sleep(args.linger)
        (args.out / "arrived-0").write_text(repr(time.time()))
    shutdown_distributed()
    if args.linger:
        wrappers = sum(isinstance(item, DistributedDataParallel) for item in gc.get_objects())
        (args.out / f"left-{rank}.json").write_text(json.dumps({"time": time.time(), "wrappers": wrappers}))
    if code is not None:
        sys.exit(code)


def train(args) -> Optional[int]:
    """Fit the tiny model; the trainer's exit status if a signal stopped it."""
    model = tiny_model(args.dropout)
    trainer = TransformerTrainer(model, 3e-3, 5, weight_decay=0.01, output_dir=args.out, quiet=True)
    losses = {}
    trainer.add_callback("on_step_end", lambda t: losses.__setitem__(t.state.step, t.last_log["loss"]))
    if args.sleep:
        trainer.add_callback("on_step_end", lambda t: time.sleep(args.sleep))
    evaluation = {"eval_data": tiny_dataset(16, seed=1), "eval_every": args.eval_every}
    evaluation = evaluation if args.eval_every else {}
    try:
        trainer.fit(tiny_dataset(), collate_fn=PaddingCollator(0), batch_size=args.batch_size, epochs=None,
                    max_steps=args.steps, save_every=args.save_every,
                    resume_from=True if args.resume else None, **evaluation)
    except TrainingInterrupted as error:
        print(error, file=sys.stderr)
        return error.exit_code
    if args.losses and distributed_info().is_main:
        (args.out / "losses.json").write_text(json.dumps(losses))
        torch.save({name: value.detach().clone() for name, value in model.state_dict().items()}, args.out / "params.pt")
    return None


if __name__ == "__main__":
    main()
