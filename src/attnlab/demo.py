"""Demonstration job: an encoder on a padded batch, with per-layer attention statistics."""

from __future__ import annotations

import argparse
import sys

import torch

from .layers import TransformerEncoder


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="random seed")


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    model = TransformerEncoder(1000, d_model=64, num_layers=3, num_heads=4, d_ff=128, pad_id=0).eval()
    lengths = [12, 7, 3]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(1, 1000, (length,))
    with torch.no_grad():
        hidden, attentions = model(ids, output_attentions=True)
    print(f"input ids {tuple(ids.shape)}, lengths {lengths} -> hidden {tuple(hidden.shape)}")
    valid = ids != 0
    for name, weights in attentions.items():
        probs = weights.transpose(1, 2)[valid]  # [tokens, H, S]: rows of real queries
        entropy = -(probs.clamp_min(1e-12).log() * probs).sum(-1)
        print(f"{name}: weights {tuple(weights.shape)}, mean entropy per head "
              + " ".join(f"{value:.3f}" for value in entropy.mean(0).tolist()))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlab.demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
